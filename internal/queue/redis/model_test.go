package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The model test on the Redis store (see queuetest/model.go), as on the
// embedded store (bolt/model_test.go). CI runs a few seeds; a soak is
//
//	THROTTLER_MODEL_SEEDS=100 go test -run 'TestModel$' ./internal/queue/redis/
//
// (THROTTLER_MODEL_STEPS sets the steps per seed, THROTTLER_MODEL_SEED=N
// runs seed N alone). Every crash costs a lease (modelLease) of real time:
// the new process takes the partitions only once the old one's leases
// lapse.

// modelKnown are the defects the model tolerates on this store; the
// regression cases below pin each one.
const modelKnown = queuetest.DefectPushbackWindow |
	queuetest.DefectWindowFuture |
	queuetest.DefectSlowReloadPromise

// modelLease is the partitions' lease in model runs: a crash waits for it.
const modelLease = 250 * time.Millisecond

// modelSkews are how far the model's processes' own clocks are off the
// run's clock (which stands for Redis's TIME), one after another: a
// takeover is between workers whose clocks disagree by seconds, and
// nothing may show it.
var modelSkews = []time.Duration{0, 2 * time.Second, -1500 * time.Millisecond, 350 * time.Millisecond, -40 * time.Millisecond}

// skewedClock reads clock plus skew; it waits as clock does.
type skewedClock struct {
	clock.Clock
	skew time.Duration
}

func (c skewedClock) Now() time.Time { return c.Clock.Now().Add(c.skew) }

// modelPartitions: the model has two tenants; a few partitions are enough
// and quick to take.
const modelPartitions = 4

// modelKeyspaces hands each model run a Redis database of its own on
// redis-servers of the test's (never the shared one): a run's data, all its
// processes' (crashes restart on the same database), is nobody else's. A
// database is given again, flushed, once every client of the run on it is
// closed (the runner closes each store, and a store closes its client).
type modelKeyspaces struct {
	t     testing.TB // the test that started the servers (their lifetime)
	mu    sync.Mutex
	slots []*modelSlot
}

type modelSlot struct {
	addr    string
	db      int
	clients []*goredis.Client
}

// modelDatabases is how many databases a redis-server has by default.
const modelDatabases = 16

func newModelKeyspaces(t testing.TB) *modelKeyspaces {
	k := &modelKeyspaces{t: t}
	k.addServer()
	return k
}

// addServer starts a server (on the test's goroutine: it may t.Fatal).
func (k *modelKeyspaces) addServer() {
	srv := redistest.Start(k.t, false)
	for db := range modelDatabases {
		k.slots = append(k.slots, &modelSlot{addr: srv.Addr, db: db})
	}
}

// probe marks a command of the keyspaces' own, which a cut passes (to find
// out whether a client is closed).
type probe struct{}

// take gives a free database, flushed (waiting for one if the runs in
// progress hold them all).
func (k *modelKeyspaces) take() (*modelSlot, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		k.mu.Lock()
		for _, sl := range k.slots {
			if sl.free() {
				sl.clients = nil
				c := goredis.NewClient(&goredis.Options{Addr: sl.addr, DB: sl.db, PoolSize: 2})
				err := c.FlushDB(context.Background()).Err()
				// A Redis that has seen the partitions (seenPartitions):
				// the first worker takes them at once, and admission does
				// not promise the wait of a vacancy the model does not know.
				for p := range modelPartitions {
					if err == nil {
						err = c.Set(context.Background(), owner.KeyPrefix(p)+"epoch", 1, 0).Err()
					}
				}
				c.Close()
				if err != nil {
					k.mu.Unlock()
					return nil, err
				}
				sl.clients = []*goredis.Client{nil} // taken: the first client comes next
				k.mu.Unlock()
				return sl, nil
			}
		}
		k.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, errors.New("model: no free Redis database for a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// free: every client of the slot's run is closed. k.mu held.
func (sl *modelSlot) free() bool {
	ctx := context.WithValue(context.Background(), probe{}, true)
	for _, c := range sl.clients {
		if c == nil {
			return false // taken, no client yet
		}
		if err := c.Ping(ctx).Err(); !errors.Is(err, goredis.ErrClosed) {
			return false
		}
	}
	return true
}

// cutHook fails every command of a client once cut: the process is dead
// (kill -9), so nothing it does reaches Redis any more. While stopped
// (SIGSTOP: stop set) its commands wait, and go on once stop is closed
// (SIGCONT), all but its heartbeats: the test stops the woken process
// (its Consume) at once, and a heartbeat in between would make it a live
// worker again for a moment, to which the new one could hand partitions
// back (a clean handover, tested elsewhere; here it would come at a
// moment the model does not choose).
type cutHook struct {
	cut  *atomic.Bool
	stop *atomic.Pointer[chan struct{}]
}

var (
	errCut   = errors.New("model: this process was killed (kill -9): nothing it sends reaches Redis")
	errWoken = errors.New("model: this process woke from SIGSTOP and is being stopped: it does not rejoin the live workers")
)

// pass is what becomes of cmds of the client now: an error, or nil (after
// waiting out a stop).
func (h cutHook) pass(ctx context.Context, cmds ...goredis.Cmder) error {
	if ctx.Value(probe{}) != nil {
		return nil
	}
	if h.cut.Load() {
		return errCut
	}
	if ch := h.stop.Load(); ch != nil {
		select {
		case <-*ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, c := range cmds {
			if slices.Contains(c.Args(), any(owner.WorkersKey)) {
				return errWoken
			}
		}
	}
	return nil
}

func (h cutHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h cutHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if err := h.pass(ctx, cmd); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h cutHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if err := h.pass(ctx, cmds...); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// modelDriver runs the model on the Redis store, each run on a database of
// ks; known are the defects it tolerates.
func modelDriver(ks *modelKeyspaces, known queuetest.Defect) queuetest.ModelDriver {
	var mu sync.Mutex
	cuts := map[*Store]cutHook{}
	ready := map[*Store]bool{}
	open := func(sl *modelSlot, c queuetest.Config) (queue.Store, error) {
		cut := cutHook{cut: &atomic.Bool{}, stop: &atomic.Pointer[chan struct{}]{}}
		rdb := goredis.NewClient(&goredis.Options{Addr: sl.addr, DB: sl.db})
		rdb.AddHook(cut)
		ks.mu.Lock()
		n := slices.Index(sl.clients, nil) // which process of the run this is
		if n >= 0 {
			sl.clients[n] = rdb // the place take or a crash kept for it
		} else {
			n = len(sl.clients)
			sl.clients = append(sl.clients, rdb)
		}
		ks.mu.Unlock()
		// Each process's own clock is off the run's (Redis's) by its own
		// skew: it works in Redis's time through the offset it measures.
		own := skewedClock{Clock: c.Clock, skew: modelSkews[n%len(modelSkews)]}
		s, err := Open(context.Background(), Options{Client: rdb, OwnsClient: true, Clock: c.Clock, Testing: &TestHooks{OwnClock: own}, Policy: c.Policy, Caps: c.Caps, StartLag: -1,
			Partitions: modelPartitions, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			// Quick polls of the arrivals (real time); a short lease, as
			// each crash waits for it.
			Timing: Timing{Poll: 2 * time.Millisecond, Lease: modelLease}})
		if err != nil {
			rdb.Close()
			return nil, err
		}
		mu.Lock()
		cuts[s] = cut
		mu.Unlock()
		return s, nil
	}
	// forget takes st out of the driver's stores (a process killed or
	// stopped) and returns its client's hook and how to start the next
	// process on its database.
	forget := func(st *Store) (cutHook, func(testing.TB, queuetest.Config) (queue.Store, error), error) {
		mu.Lock()
		cut, ok := cuts[st]
		delete(cuts, st)
		delete(ready, st)
		mu.Unlock()
		if !ok {
			return cut, nil, fmt.Errorf("model: crash of a store this driver did not open")
		}
		var sl *modelSlot
		ks.mu.Lock()
		for _, x := range ks.slots {
			for _, c := range x.clients {
				if c == st.rdb {
					sl = x
				}
			}
		}
		if sl != nil {
			// Taken until the restart opens its client: between the old
			// client's close and the new one's, every client of the slot
			// is closed, and another run would take (and flush) it.
			sl.clients = append(sl.clients, nil)
		}
		ks.mu.Unlock()
		if sl == nil {
			return cut, nil, fmt.Errorf("model: the crashed store's database is not known")
		}
		return cut, func(t testing.TB, c queuetest.Config) (queue.Store, error) {
			s, err := open(sl, c)
			if err != nil {
				return nil, err
			}
			if err := takeOverAll(s.(*Store)); err != nil {
				s.Close()
				return nil, err
			}
			return s, nil
		}, nil
	}
	return queuetest.ModelDriver{
		Open: func(t testing.TB, c queuetest.Config) (queue.Store, error) {
			sl, err := ks.take()
			if err != nil {
				return nil, err
			}
			return open(sl, c)
		},
		// kill -9 of the worker leaves Redis as it is (Redis does not
		// crash here): the old process's client is cut, so that nothing it
		// does reaches Redis any more (no clean handover: its leases lapse
		// by themselves), and the restart is a new Store, its own client,
		// on the same database, which takes the partitions once they do.
		Crash: func(t testing.TB, s queue.Store) (func(testing.TB, queuetest.Config) (queue.Store, error), error) {
			st := s.(*Store)
			cut, restart, err := forget(st)
			if err != nil {
				return nil, err
			}
			cut.cut.Store(true)
			return restart, nil
		},
		// SIGSTOP: the process's commands wait (its leases lapse, as it
		// renews none), another process takes over, and at SIGCONT the
		// commands go on: each finds the partition another's (the fence).
		Freeze: func(t testing.TB, s queue.Store) (func(testing.TB, queuetest.Config) (queue.Store, error), func(), error) {
			st := s.(*Store)
			cut, restart, err := forget(st)
			if err != nil {
				return nil, nil, err
			}
			stopped := make(chan struct{})
			cut.stop.Store(&stopped)
			st.pauseWorkers(true)
			thaw := func() {
				close(stopped)
				st.pauseWorkers(false)
				// Awake, it finds its tenures gone (its renewals refused).
				deadline := time.Now().Add(10 * time.Second)
				for st.heldCount() > 0 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			return restart, thaw, nil
		},
		// Quiet until the store hands over: every partition owned and
		// loaded (a new Redis holds them vacant for a lease, a crashed
		// process's lease must lapse first), so that the fake clock does
		// not move while nobody can send.
		//
		// And quiet only once its owners have caught up: every arrival
		// read, every job due by now and the lead handed over, no claim
		// or record under way (Store.CaughtUp). That work takes real time
		// (polls, round trips): on a busy machine, a check made before it
		// saw the store a moment behind the fake clock.
		Quiet: func(s queue.Store) bool {
			st := s.(*Store)
			mu.Lock()
			ok := ready[st]
			mu.Unlock()
			if !ok {
				if !st.Ready(context.Background()) {
					return false
				}
				mu.Lock()
				ready[st] = true
				mu.Unlock()
			}
			return st.CaughtUp(context.Background())
		},
		Busy: func(s queue.Store) string { return s.(*Store).busyWith() },
		TAT: func(s queue.Store, tenant string) (time.Time, error) {
			st := s.(*Store)
			k := keysOf(st.partOf(tenant))
			v, err := st.rdb.HGet(context.Background(), k.tenant(tenant), "tat").Int64()
			if errors.Is(err, goredis.Nil) {
				return time.Time{}, nil
			}
			if err != nil {
				return time.Time{}, err
			}
			return fromMicros(v), nil
		},
		Windows: func(s queue.Store, tenant string, w leaky.Window) ([]time.Time, error) {
			st := s.(*Store)
			l, err := st.rdb.LRange(context.Background(), keysOf(st.partOf(tenant)).window(tenant, w), 0, -1).Result()
			return parseRecent(l), err
		},
		// Every change of a schedule is a script's write in Redis.
		Durable: true,
		Known:   known,
	}
}

// busyWith says why the store is not Quiet (for a model run's failure to
// settle).
func (s *Store) busyWith() string {
	ctx := context.Background()
	if !s.Ready(ctx) {
		return "not ready (a partition without a loaded owner)"
	}
	if why := s.behind(ctx); why != "" {
		return why
	}
	return "caught up now"
}

// pauseWorkers pauses (or resumes) the lease keeping of this process's
// consumers (owner.Manager.Pause).
func (s *Store) pauseWorkers(on bool) {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	for c := range s.consumers {
		c.mgr.Pause(on)
	}
}

// takeOverAll is the start of a new process on a Redis a crashed one left:
// it takes every partition once the dead one's leases lapse, and loads it
// (takeover.lua: the jobs it was sending taken back, the schedules of
// overdue tenants moved), as Consume's owners do; then it hands the
// partitions back at once (its Consume takes them again, and finds them
// loaded), so that what the model checks of a restart is what Redis holds
// after the takeover, not before it.
func takeOverAll(s *Store) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	taken := map[int]chan struct{}{}
	var failed error
	// The manager may call Acquired before New returns it: the calls'
	// goroutines read mgr once it is set.
	var mgr *owner.Manager
	mgrSet := make(chan struct{})
	mgr, err := owner.New(owner.Options{Client: s.rdb, Partitions: s.partitions, WorkerID: fmt.Sprintf("model-restart-%p", s),
		Lease: s.timing.Lease, Logger: s.log,
		Acquired: func(p int, epoch int64) {
			done := make(chan struct{})
			// Added before the partition counts as taken: the loop below
			// waits for the group once all are, and an Add after that
			// raced with its Wait (a race report in CI).
			mu.Lock()
			taken[p] = done
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer close(done)
				<-mgrSet
				f, ok := mgr.Fence(p)
				if !ok || f.Epoch != epoch {
					return
				}
				if _, _, _, err := s.takeOver(context.Background(), f, keysOf(p)); err != nil {
					mu.Lock()
					failed = errors.Join(failed, err)
					mu.Unlock()
				}
			}()
		},
		Drain: func(ctx context.Context, p int) {
			mu.Lock()
			done := taken[p]
			mu.Unlock()
			if done != nil {
				<-done
			}
		},
	})
	close(mgrSet)
	if err != nil {
		return err
	}
	if err := mgr.Start(context.Background()); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(taken)
		mu.Unlock()
		if n == s.partitions || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	mgr.Stop()
	mu.Lock()
	defer mu.Unlock()
	if len(taken) != s.partitions {
		failed = errors.Join(failed, fmt.Errorf("model: the restart took %d of %d partitions within 20s", len(taken), s.partitions))
	}
	return failed
}

// TestModel: seeds 1-16 in CI (about 10 s; 4 under the race detector), two
// short ones under -short (the edit loop); a soak with
// THROTTLER_MODEL_SEEDS. Its processes' clocks are skewed (modelSkews),
// and some of its crashes are processes stopped past their lease that wake
// once another has taken over (OpStale).
// docs/RELIABILITY.md, "The model test on Redis", has the soaks.
func TestModel(t *testing.T) {
	seeds, steps := 16, 80
	if testutil.Race {
		seeds, steps = 4, 50
	}
	if testing.Short() {
		seeds, steps = 2, 40
	}
	queuetest.RunModel(t, modelDriver(newModelKeyspaces(t), modelKnown), seeds, steps)
}

// The cases the model found on this store, shrunk. Each runs with the
// tolerances of TestModel but its own: a defect still open is skipped
// (THROTTLER_MODEL_DEFECTS=1 runs it; its fix removes the skip and the
// flag from modelKnown); the rest pass.
func TestModelRegression(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		defect queuetest.Defect // the tolerance this case must run without
		skip   string           // "": it passes
		ops    []queuetest.Op
	}{
		{
			// Found by the model (as on the embedded store, fixed there): a job
			// admitted to a held tenant with a deadline was expired late,
			// at the owner's next recheck of the held job. The claim that
			// finds it held now comes back just past its deadline too.
			name: "HeldDeadline", defect: queuetest.DefectLateExpiry,
			ops: []queuetest.Op{
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 320 * ms}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
			},
		},
		{
			// Seed 181 of a soak once HeldDeadline was fixed: a held
			// tenant's retry whose deadline passed while its owner was
			// down was looked at, after the takeover, only when a resume
			// would send it (takeover.lua told the deadlines of jobs a
			// pause moved, not of held ones). It now tells a held job's
			// deadline too, and the owner looks at it then.
			name: "HeldDeadlineAcrossATakeover",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * ms, Timeout: 150 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 2, Key: "k0", Deadline: 470 * ms}}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpCrash, D: 300 * ms},
			},
		},
		{
			// Found by the first driver, whose restart was checked before the
			// takeover: a held tenant's job with a deadline across a crash.
			name: "HeldDeadlineRestart",
			ops: []queuetest.Op{
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 420 * ms}}},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpCrash, D: 200 * ms},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
			},
		},
		{
			// Found by the model: jobs whose slots passed during the downtime
			// kept them after the takeover (dispatch_at before the restart).
			name: "RestartOverdue", defect: queuetest.DefectRestartOverdue,
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrash, D: 250 * ms},
			},
		},
		{
			// Found by the first driver, before Durable: a held tenant's
			// cancelled job across a crash (Redis keeps the place given back).
			name: "HeldCancelRestart",
			ops: []queuetest.Op{
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCancel, Pick: 267},
				{Kind: queuetest.OpCrash},
			},
		},
		{
			// Found by the model: a job the crashed owner was sending (a
			// timeout in flight) was taken back as retrying, not queued.
			name: "TakenBackState",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 50 * ms, Timeout: 100 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 520 * ms}}},
				{Kind: queuetest.OpCrash},
			},
		},
		{
			// Found by the model: a job sent again after a lost write came as
			// attempt 2 (no attempt was recorded).
			name: "TakenBackAttempts",
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Found by the model, no flag yet (seeds 1 and 2 of the random
			// run): after a lost write of a token tenant with a window, the
			// job taken back says dispatch_at T0+100ms and is not sent then;
			// likely RestartOverdue's root (the owner's floor and pace are in
			// memory only, so the record says a time the owner does not keep).
			name: "TakenBackNotSentWhenDue",
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k4"}, {Deadline: 320 * ms}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpCrashOnWrite},
			},
		},
		{
			// Found by the model after RestartOverdue's fix: a takeover
			// re-spaced by the rate only, not by the windows, so with a write
			// lost in the crash a window held one send too many (3 sends
			// within 200ms under 2/500ms). Fixed: takeover.lua moves each job
			// by its windows too, as bolt's respaceTenant does.
			name: "TakeoverWindow", defect: queuetest.DefectRestartOverdue,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2, Windows: []queuetest.WindowSpec{{N: 2, Length: 500 * ms}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrashOnWrite},
			},
		},
		{
			// Found by the model: a retry's slot after a crash, with
			// windows, came sooner than the windows allow (slots [500ms]
			// where they allow [1.05s]). Fixed with TakeoverWindow.
			name: "RetrySlotAfterCrash",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 400 * ms}},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 3}}},
				{Kind: queuetest.OpAdvance, D: 250 * ms},
			},
		},
		{
			// Found by the random run (seed 13): a job whose dispatch time
			// a pause had moved past its deadline, taken over, was looked at
			// only at its dispatch time: queued (and counted) 80 ms past its
			// deadline. takeover.lua now tells the owner the deadline.
			name: "TakenOverPastDeadline",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 520 * ms}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
			},
		},
		{
			// Found by the random run (seed 8): a retry that a pause (429)
			// moved past its deadline was expired when claimed, 120 ms
			// before its deadline, where the embedded store keeps it
			// waiting until then. claim.lua now expires it at its deadline.
			name: "PausedPastDeadlineExpiresAtIt",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 0}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPermanent}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 320 * ms}}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 3}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpRetry, Pick: 916},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
			},
		},
		{
			// Found by the random run (seed 9): a burst-2 tenant's send
			// recorded, then a crash: the new owner's schedule for the
			// tenant (no jobs waiting) kept the burst credit the last send
			// may have used (a frozen old owner may even send late), so a
			// job admitted next was promised the old owner's instant, though
			// the floor held its send an interval later. takeover.lua now
			// starts every tenant whose next send was still to come from it
			// (partKeys.recent), jobs or not.
			name: "NoBurstCreditAcrossATakeover",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Found by the random run (seed 18), after the fix above: a held
			// tenant's schedule was raised only while its next send was
			// ahead in real time, but a held tenant's clock stands still.
			// takeover.lua compares in the tenant's time.
			name: "NoBurstCreditForAHeldTenant",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpCrash},
			},
		},
		{
			// Found by the random run (seed 20; fails one replay in three
			// without the fix): a job the restart's first takeover moved past
			// its deadline was not reported by the second (the store's own
			// owner taking the partition again), so it stayed queued past
			// its deadline. takeover.lua looks at every waiting job's
			// deadline now.
			name: "DeadlineAcrossASecondTakeover",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 0}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpCancel, Pick: 95},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k3", Deadline: 70 * ms}, {}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
			},
		},
		{
			// A retry whose backoff ends past its place went at the end of
			// its backoff, on the slot of a job admitted meanwhile (two
			// sends 50 ms apart at T = 100 ms; the owner's pace then sent
			// one an interval late). It is booked there now, and the job
			// admitted meanwhile is placed around it (rules.Record's
			// Absorb), as on the embedded store.
			name: "RetryPacing", defect: queuetest.DefectRetryPacing,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 250 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Two jobs sent together (burst 2) and answered 429 kept their
			// slot, so they went again together when the pause ended: a
			// burst after the pause (DESIGN 3.6), which the owner's pace
			// then made up for by sending the next pair an interval late.
			// The second takes the schedule's next place now
			// (queue.ApplyOutcome), as on the embedded store.
			name: "PushbackBurst", defect: queuetest.DefectPushbackBurst,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 0}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {}}},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
			},
		},
		{
			// Seed 29: after a reload to a slower rate, the owner's pace
			// (the gate, read ahead) held a retry booked at the old spacing
			// past its slot; the model now takes such a write up to when
			// the rate in force allows it.
			name: "HeldToTheNewRate",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 200 * ms, Timeout: 100 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 150 * ms, Burst: 1, Capacity: 4}},
			},
		},
		{
			// Seed 90: a job a second pushback moved past its deadline was
			// looked at at its deadline only once its tenant's pace allowed
			// a send: queued past its deadline. Such a look passes the pace.
			name: "ExpiryPassesThePace",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 4}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 470 * ms}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
			},
		},
		{
			// Seed 86: a takeover after a reload gave a tenant with no jobs
			// left burst credit. Every claim notes its tenants in recent,
			// and its last dispatch and cost, spaced at the rate in force.
			name: "NoBurstCreditAfterAReload",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 3, Deadline: 70 * ms}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 0}},
				{Kind: queuetest.OpCrash},
			},
		},
		{
			// Seed 132, found with the fix above (every claimed tenant in
			// recent, so a takeover gives it a floor): a job admitted after
			// the takeover was held to the last owner's floor, past the
			// slot it was promised (a reload gave more burst). The floor
			// holds only the jobs waiting at the takeover now.
			name: "AdmittedAfterATakeoverGoesAtItsSlot",
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k4", Deadline: 470 * ms}}},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k1"}}},
			},
		},
		{
			// Seed 91: a second takeover took a booked retry for a job a
			// vacancy placed past the schedule's end and raised the
			// schedule past it. That rule skips bookings now.
			name: "SecondTakeoverSkipsABooking",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 350 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 250 * ms},
			},
		},
		{
			// Seed 134: after a reload to a slower rate, the restart's
			// first takeover left the schedule's end where the old rate
			// put it, and the second (the store's own owner) raised it by
			// the new rate past the last job: the two disagreed by half an
			// interval. The rule for the schedule's end now runs in every
			// takeover, not only where that job is still ahead of the
			// jobs it moved.
			name: "TakeoversAgreeAfterASlowerReload",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 200 * ms, Timeout: 150 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {Key: "k0"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2, Windows: []queuetest.WindowSpec{{N: 2, Length: 500 * ms}}}},
				{Kind: queuetest.OpCrash, D: 300 * ms},
			},
		},
		{
			// Seed 134, once the case above passed: a job admitted after a
			// reload from 100 ms to 150 ms, behind a job the old rate put at
			// T0+100ms, was told 200 ms (the old schedule's end) and sent
			// at 240 ms: the owner's pace (the gate's rate, read ahead)
			// held it to the new rate. Open on both stores (the embedded
			// store's gate does the same; its model driver has no gate).
			name: "SlowReloadPromise", defect: queuetest.DefectSlowReloadPromise,
			skip: "defect: after a reload to a slower rate, a job admitted behind the old rate's schedule is told that schedule's end, and the gate holds it to the new rate (told 200 ms, sent at 240 ms), see docs/RELIABILITY.md",
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 150 * ms, Burst: 1, Capacity: 4}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k2", Deadline: 520 * ms}}},
			},
		},
		{
			// Found when the model's processes began to wake (seed 67 of
			// that run): a held tenant's job whose write was lost in a
			// crash waits at the takeover for its floor (the lost write
			// plus an interval, in the owner's memory); the resume made it
			// due at once, so it was claimed 100 ms before that floor and
			// read "dispatching", out of the next hold's reach, until then.
			// A resume now wakes it at its floor.
			name: "ResumeWaitsForTheFloor",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * ms, Timeout: 100 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpHold, Tenant: "b"},
			},
		},
		{
			// Found when the model's seeds moved (seed 193 of that run), a
			// fault of the model: a window that a reload drops and a later
			// one brings back still counts its sends on Redis (each
			// window's list is a key of its own), where the model had
			// forgotten them as the embedded store did. Redis's refusal
			// was right: the job sent at T0 was in it. The model and both
			// stores now keep such windows.
			name: "DroppedWindowComesBack",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2, Windows: []queuetest.WindowSpec{{N: 2, Length: 500 * ms}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * ms, Timeout: 150 * ms}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpCancel, Pick: 826},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Seeds 240 and 262 of a soak of seeds 201-500, a fault of the
			// model: after a reload from burst 2 at 100 ms to burst 1 at
			// 50 ms, two jobs sent together keep the gate's schedule where
			// the old interval put it (the gate moves it on by each send's
			// cost at the interval in force then, and takes the tolerance
			// from the policy now), so the third goes at T0+200ms. The
			// model had recomputed it at the new interval and wanted it
			// at T0+100ms. It now keeps the gate's steps (mjob.latest).
			name: "GateKeepsItsSteps",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {Key: "k3"}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3}},
			},
		},
		{
			// Seed 414 of that soak: a job behind another answered 429
			// again and again is moved past its deadline by the pauses,
			// but the owner looked at it only when its tenant's pace let
			// it, and the resends took every turn: it stayed queued (and
			// counted) past its deadline until they stopped. A pushback
			// now reads the jobs it moves past their deadlines
			// (missed.lua), which the owner looks at then.
			name: "DeadlineBehindRepeatedPushbacks",
			ops: []queuetest.Op{
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k0"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 470 * ms}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpAdvance, D: 950 * ms},
			},
		},
		{
			// Seed 260 of that soak, on both stores
			// (queuetest.CaseBookedRetriesAndTheRate).
			name: "BookedRetriesAndTheRate",
			ops:  queuetest.CaseBookedRetriesAndTheRate,
		},
		{
			// Seed 477 of a soak of seeds 1-500 beside two busy loops (the
			// shrunk case fails on every run of the code before): a job
			// the owner held back for its tenant's pace (the pace of a
			// claim at 100 ms) waited for that pace after a reload to 50 ms
			// and burst 3, which lets it go 50 ms sooner; nothing looked at
			// it again before the old pace came. A reload now re-paces
			// such jobs (Store.PoliciesChanged).
			name: "ReloadLetsThePacedGo",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 0}},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpStale},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpAdvance, D: 250 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {Cost: 2, Key: "k1"}, {}, {}, {Cost: 2, Deadline: -120 * ms}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k0"}, {}, {}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k2"}}},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 3, Capacity: 0}},
				{Kind: queuetest.OpAdvance, D: 250 * ms},
			},
		},
		{
			// Seed 69 of a soak (also 29, 71, 76): a capped tenant's job
			// that a takeover moved past its deadline waited, queued, for
			// a place under the cap, which the attempt cut short by the
			// crash held until its place lapsed (DESIGN.md 6e). Its claim
			// at its deadline takes no place now: it may only expire it
			// (expireOnly).
			name: "ExpiryTakesNoPlace",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 3, Capacity: 0, MaxInFlight: 1}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 370 * ms}}},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpStale, D: 300 * ms},
			},
		},
		{
			// Seed 76, the same after a crash.
			name: "ExpiryTakesNoPlaceAfterACrash",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 3, Capacity: 0, MaxInFlight: 1}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {Deadline: 70 * ms}, {Key: "k0", NotBefore: 700 * ms}, {Key: "k5"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {Key: "k2", Deadline: 70 * ms}}},
				{Kind: queuetest.OpCrash, D: 200 * ms},
			},
		},
		{
			// CI's own -race run (4 seeds x 50 steps) failed once on seed
			// 3 (2026-12-07): after a crash and a restart, tenant b's
			// queue_depth was 2, the model's 1 (its job #8 queued in the
			// store, in flight in the model).
			// Its shrunk case passed 80 of 80 replays (30 of them under
			// -race beside two busy loops). Open.
			name: "DepthAfterACrashUnderRace", skip: "open: a tenant's depth one over the model's after a crash (CI -race seed 3, 1 run)",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * time.Millisecond, Burst: 2, Capacity: 2, MaxInFlight: 2}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 150 * time.Millisecond, Burst: 1, Capacity: 4}},
				{Kind: queuetest.OpAdvance, D: 150 * time.Millisecond},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPermanent}},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 200 * time.Millisecond, Timeout: 150 * time.Millisecond}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {NotBefore: 400 * time.Millisecond}, {Cost: 3}}},
				{Kind: queuetest.OpRetry, Pick: 614},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 70 * time.Millisecond}, {}}},
				{Kind: queuetest.OpCancel, Pick: 93},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 570 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 1 * time.Second}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 50 * time.Millisecond}}},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * time.Millisecond, Timeout: 50 * time.Millisecond}},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k0"}}},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpCrash, D: 200 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpCancel, Pick: 671},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPermanent}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 2}}},
			},
		},
		{
			// Soak seed 64 (with the windows' sends made; it fails alike on
			// the build before): at a reload to a slower rate of a tenant
			// capped, booked and crashed, the store's schedule (tat) is one
			// new interval short of the model's (2 to 3 runs of 8). Open.
			name: "CappedReloadAfterACrash", skip: "open: a capped tenant's schedule at a reload after a crash (soak seed 64, 2-3 runs of 8)",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 3, Capacity: 0, MaxInFlight: 1}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpCancel, Pick: 606},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 4, MaxInFlight: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 850 * time.Millisecond}}},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {}, {}}},
				{Kind: queuetest.OpCancel, Pick: 216},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpRetry, Pick: 474},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 4}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k2"}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 3, Capacity: 0, MaxInFlight: 1}},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{NotBefore: 1400 * time.Millisecond}}},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {Key: "k2"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 50 * time.Millisecond}}},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 2, MaxScheduled: 2}},
			},
		},
		{
			// Soak seed 20: a capped tenant's job past its deadline after
			// crashes and a hold is still queued when the model has it
			// expired (2 runs of 8). Open.
			name: "CappedExpiryAfterCrashesAndAHold", skip: "open: a capped tenant's expiry after crashes and a hold (soak seed 20, 2 runs of 8)",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * time.Millisecond, Burst: 2, Capacity: 2, MaxInFlight: 2}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * time.Millisecond, Burst: 2, Capacity: 2, MaxInFlight: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 2, Deadline: 220 * time.Millisecond, NotBefore: 600 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 4, Deadline: 570 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 620 * time.Millisecond}}},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k1"}, {Deadline: 120 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k0"}}},
				{Kind: queuetest.OpAdvance, D: 250 * time.Millisecond},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 200 * time.Millisecond},
				{Kind: queuetest.OpCancel, Pick: 679},
				{Kind: queuetest.OpCancel, Pick: 95},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k3", Deadline: 70 * time.Millisecond}, {}, {Key: "k3", Deadline: 570 * time.Millisecond, NotBefore: 300 * time.Millisecond}}},
				{Kind: queuetest.OpStale},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 4, NotBefore: 1250 * time.Millisecond}, {Key: "k2"}}},
				{Kind: queuetest.OpCrash, D: 50 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: -120 * time.Millisecond}}},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 150 * time.Millisecond, Timeout: 100 * time.Millisecond}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k4", Deadline: 570 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{NotBefore: 1350 * time.Millisecond}}},
				{Kind: queuetest.OpAdvance, D: 800 * time.Millisecond},
			},
		},
		{
			// Cancelling such a retry gave back a place it never held.
			name: "RetryPacingCancel", defect: queuetest.DefectRetryPacing,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * ms, Timeout: 50 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCancel, Pick: 864},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k3"}}},
			},
		},
	}
	ks := newModelKeyspaces(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.skip != "" && os.Getenv("THROTTLER_MODEL_DEFECTS") == "" {
				t.Skip(c.skip)
			}
			queuetest.ReplayModel(t, modelDriver(ks, modelKnown&^c.defect), c.ops)
		})
	}
}
