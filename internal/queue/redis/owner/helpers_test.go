package owner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The tests' timing: a lease of a second (5 s in production), so that a
// takeover takes about that; balancing every 100 ms. Under the race
// detector, on two shared cores, a renewer can stall for the 470 ms that
// would lose a 1 s lease: 2 s there.
const testBalance = 100 * time.Millisecond

var testLease = map[bool]time.Duration{false: time.Second, true: 2 * time.Second}[testutil.Race]

// slack is the room a timing bound gets for a loaded machine: 2 cores
// shared with other tests, more under the race detector.
func slack() time.Duration {
	if testutil.Race {
		return 1500 * time.Millisecond
	}
	return 500 * time.Millisecond
}

// env is one test's redis-server, its managers and what they did.
type env struct {
	t   *testing.T
	srv *redistest.Server // nil on a Cluster
	rdb goredis.UniversalClient
	P   int
	rec *recorder

	mu  sync.Mutex
	ms  []*tm
	log *testLog
}

// tm is one manager of a test, with its own way to crash.
type tm struct {
	*Manager
	crash context.CancelFunc
}

// newEnv starts a redis-server of the test's own (with aof: appendonly)
// and a sampler that checks, every few milliseconds until the test ends,
// that no partition has two owners at once.
func newEnv(t *testing.T, P int, aof bool) *env {
	t.Helper()
	return newEnvOn(t, P, func(e *env) {
		e.srv = redistest.Start(t, aof)
		e.rdb = goredis.NewClient(&goredis.Options{Addr: e.srv.Addr})
	})
}

// newClusterEnv is newEnv on a Redis Cluster of three masters.
func newClusterEnv(t *testing.T, P int) *env {
	t.Helper()
	return newEnvOn(t, P, func(e *env) {
		c := redistest.StartCluster(t, 3)
		opts, err := goredis.ParseClusterURL(c.URL())
		if err != nil {
			t.Fatal(err)
		}
		e.rdb = goredis.NewClusterClient(opts)
	})
}

func newEnvOn(t *testing.T, P int, connect func(*env)) *env {
	e := &env{t: t, P: P, rec: &recorder{}, log: &testLog{t: t}}
	t.Cleanup(e.log.close) // first registered, so it runs last
	connect(e)
	t.Cleanup(func() { e.rdb.Close() })
	e.sample()
	return e
}

// start starts a manager named id (tests sort their ids a, b, c, ...).
func (e *env) start(id string, mod func(*Options)) *tm {
	e.t.Helper()
	o := Options{Client: e.rdb, Partitions: e.P, WorkerID: id, Lease: testLease, Balance: testBalance,
		DrainTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(e.log, nil))}
	o.Acquired = func(p int, epoch int64) { e.rec.add(id, "acquired", p, epoch) }
	o.Lost = func(p int) { e.rec.add(id, "lost", p, 0) }
	var m *Manager
	o.Drain = func(ctx context.Context, p int) { e.drain(m, p) }
	if mod != nil {
		mod(&o)
	}
	m, err := New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	w := &tm{Manager: m, crash: cancel}
	e.t.Cleanup(func() { m.Stop(); cancel() })
	e.mu.Lock()
	e.ms = append(e.ms, w)
	e.mu.Unlock()
	return w
}

// drain is the tests' Drain: what the store will do (record the
// partition's outcomes with fenced writes) while checking that the lease
// is still this worker's, and so not yet released.
func (e *env) drain(m *Manager, p int) {
	e.rec.add(m.ID(), "drain", p, 0)
	f, ok := m.Fence(p)
	v, err := e.rdb.Get(context.Background(), leaseKey(p)).Result()
	if !ok || err != nil || v != f.Token() {
		e.rec.fail(fmt.Sprintf("%s drains partition %d while its lease is %q (%v), not its own %q", m.ID(), p, v, err, f.Token()))
	} else if _, err := f.Run(context.Background(), e.rdb, countScript, []string{KeyPrefix(p) + "outcomes"}); err != nil {
		e.rec.fail(fmt.Sprintf("%s cannot record partition %d's outcomes while draining it: %v", m.ID(), p, err))
	}
	e.rec.add(m.ID(), "drained", p, 0)
}

// countScript is a fenced write: it counts in KEYS[2].
var countScript = FencedScript("return redis.call('INCR', KEYS[2])")

func (e *env) managers() []*tm {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ms)
}

// snapshot is, at one instant, the partitions every manager holds by its
// own clock: all their locks are held at once. A partition held twice is
// an error.
func (e *env) snapshot() (map[int]string, error) {
	ms := e.managers()
	for _, w := range ms {
		w.mu.Lock()
	}
	now := time.Now()
	owner := map[int]string{}
	var err error
	for _, w := range ms {
		for p, t := range w.held {
			if !now.Before(t.deadline) {
				continue
			}
			if o, ok := owner[p]; ok && err == nil {
				err = fmt.Errorf("partition %d held by %s and %s at once", p, o, w.ID())
			}
			owner[p] = w.ID()
		}
	}
	for _, w := range ms {
		w.mu.Unlock()
	}
	return owner, err
}

// sample checks snapshots every 5 ms until the test ends.
func (e *env) sample() {
	stop, done := make(chan struct{}), make(chan struct{})
	var first error
	n := 0
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				n++
				if _, err := e.snapshot(); err != nil && first == nil {
					first = err
				}
			}
		}
	}()
	e.t.Cleanup(func() {
		close(stop)
		<-done
		if first != nil {
			e.t.Errorf("sampled ownership (%d samples): %v", n, first)
		}
		if err := e.rec.check(); err != nil {
			e.t.Error(err)
		}
	})
}

// steady is whether the leases in Redis show every partition held by a
// manager that holds it in that epoch, with counts among the live
// managers differing by at most one; it returns the counts.
func (e *env) steady(live ...*tm) (map[string]int, bool) {
	leases, err := ReadLeases(context.Background(), e.rdb, e.P)
	if err != nil {
		return nil, false
	}
	counts := map[string]int{}
	for _, w := range live {
		counts[w.ID()] = 0
	}
	byID := map[string]*tm{}
	for _, w := range live {
		byID[w.ID()] = w
	}
	for _, l := range leases {
		w := byID[l.Worker]
		if w == nil || !w.Holds(l.Partition, l.Epoch) || !e.rec.told(l.Worker, l.Partition, l.Epoch) {
			return counts, false
		}
		counts[l.Worker]++
	}
	lo, hi := e.P, 0
	for _, n := range counts {
		lo, hi = min(lo, n), max(hi, n)
	}
	return counts, hi-lo <= 1
}

// waitSteady waits until steady holds among live (each lease held, and
// its holder's user told so), and returns how long.
func (e *env) waitSteady(what string, timeout time.Duration, live ...*tm) time.Duration {
	e.t.Helper()
	began := time.Now()
	testutil.WaitFor(e.t, timeout, what, func() bool { _, ok := e.steady(live...); return ok })
	return time.Since(began)
}

// partitionsOf lists the partitions w holds, with their epochs.
func partitionsOf(w *tm) map[int]int64 {
	out := map[int]int64{}
	for _, h := range w.Owned() {
		out[h.Partition] = h.Epoch
	}
	return out
}

// recorder keeps what the callbacks were told, in order, with when.
type recorder struct {
	mu     sync.Mutex
	events []event
	fails  []string
}

type event struct {
	at     time.Time
	worker string
	kind   string // acquired, lost, drain, drained
	p      int
	epoch  int64
}

func (r *recorder) add(worker, kind string, p int, epoch int64) {
	r.mu.Lock()
	r.events = append(r.events, event{time.Now(), worker, kind, p, epoch})
	r.mu.Unlock()
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	r.fails = append(r.fails, msg)
	r.mu.Unlock()
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// told reports whether worker's user was told it acquired partition p
// in epoch: a manager holds a partition a moment before it tells its
// user (a busy CI run's test looked in between).
func (r *recorder) told(worker string, p int, epoch int64) bool {
	for _, ev := range r.find("acquired", worker, p) {
		if ev.epoch == epoch {
			return true
		}
	}
	return false
}

// find is the events of kind for partition p (worker "": any worker).
func (r *recorder) find(kind, worker string, p int) []event {
	var out []event
	for _, ev := range r.all() {
		if ev.kind == kind && ev.p == p && (worker == "" || ev.worker == worker) {
			out = append(out, ev)
		}
	}
	return out
}

// tenureSpan is one tenure as its user saw it: from Acquired to Lost or
// to the end of Drain (the user has stopped sending).
type tenureSpan struct {
	worker     string
	epoch      int64
	start, end time.Time // end zero: still held
}

// spans is every partition's tenures, by start.
func (r *recorder) spans() map[int][]tenureSpan {
	out := map[int][]tenureSpan{}
	open := map[string]int{} // worker/partition -> index of its open span
	for _, ev := range r.all() {
		k := fmt.Sprintf("%s/%d", ev.worker, ev.p)
		switch ev.kind {
		case "acquired":
			open[k] = len(out[ev.p])
			out[ev.p] = append(out[ev.p], tenureSpan{worker: ev.worker, epoch: ev.epoch, start: ev.at})
		case "lost", "drained":
			if i, ok := open[k]; ok {
				out[ev.p][i].end = ev.at
				delete(open, k)
			}
		}
	}
	return out
}

// check is the first failure: a Drain that saw its lease gone, a
// partition's tenures that overlap (two owners at once, as their users
// saw it), or epochs that do not grow.
func (r *recorder) check() error {
	r.mu.Lock()
	fails := slices.Clone(r.fails)
	r.mu.Unlock()
	if len(fails) > 0 {
		return fmt.Errorf("%d failures, the first: %s", len(fails), fails[0])
	}
	for p, ss := range r.spans() {
		for i := 1; i < len(ss); i++ {
			prev, cur := ss[i-1], ss[i]
			if prev.end.IsZero() || !prev.end.Before(cur.start) {
				return fmt.Errorf("partition %d: %s's tenure (epoch %d) began before %s's (epoch %d) ended", p, cur.worker, cur.epoch, prev.worker, prev.epoch)
			}
			if cur.epoch <= prev.epoch {
				return fmt.Errorf("partition %d: epoch %d after epoch %d", p, cur.epoch, prev.epoch)
			}
		}
	}
	return nil
}

// testLog writes the managers' logs to the test's log until it ends.
type testLog struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (l *testLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

func (l *testLog) close() {
	l.mu.Lock()
	l.done = true
	l.mu.Unlock()
}

// The checks above can fail: tenures that overlap, and two managers
// holding one partition at once, are caught.
func TestChecksCatchTwoOwners(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	r.add("a", "acquired", 1, 10)
	r.add("b", "acquired", 1, 11)
	r.add("a", "lost", 1, 0)
	if err := r.check(); err == nil || !strings.Contains(err.Error(), "began before") {
		t.Errorf("overlapping tenures: %v", err)
	}
	r = &recorder{}
	r.add("a", "acquired", 1, 10)
	r.add("a", "drained", 1, 0)
	r.add("b", "acquired", 1, 10)
	if err := r.check(); err == nil || !strings.Contains(err.Error(), "epoch 10 after epoch 10") {
		t.Errorf("an epoch handed out twice: %v", err)
	}
	e := &env{t: t}
	for _, id := range []string{"a", "b"} {
		m := &Manager{o: Options{WorkerID: id}, held: map[int]*tenure{3: {epoch: 1, deadline: time.Now().Add(time.Hour)}}}
		e.ms = append(e.ms, &tm{Manager: m})
	}
	if _, err := e.snapshot(); err == nil {
		t.Error("two managers holding partition 3: no error")
	}
}
