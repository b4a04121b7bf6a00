package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// redisClient starts a redis-server of the test's own and returns a client
// on it with poolSize connections (0: go-redis's default); both stop when
// the test ends.
func redisClient(t testing.TB, poolSize int) *goredis.Client {
	srv := redistest.Start(t, false)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: poolSize})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// testLease is the partitions' lease in this package's tests.
const testLease = 300 * time.Millisecond

// conformanceLease is the lease in the conformance suite, whose tests
// assume that no lease is lost: long enough that a busy machine (a cold
// build beside the tests, the race detector) does not lose one, which a
// lost renewal or two of a 300 ms lease did. Its Redis is seeded as one
// that has seen the partitions before (seenPartitions), so no test waits
// a lease for a new partition to be held vacant.
const conformanceLease = 3 * time.Second

// seenPartitions makes rdb a Redis whose partitions have had owners that
// left cleanly (each has an epoch, no lease): the first worker takes them
// at once instead of holding them vacant for a lease (acquire.lua).
func seenPartitions(t testing.TB, rdb *goredis.Client) {
	t.Helper()
	for p := range owner.PartitionsDefault {
		if err := rdb.SetNX(context.Background(), owner.KeyPrefix(p)+"epoch", 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisConformance runs the shared suite, each test on a redis-server
// of its own.
func TestRedisConformance(t *testing.T) {
	queuetest.Run(t, queuetest.Driver{New: func(t *testing.T) queuetest.Open {
		rdb := redisClient(t, 0)
		seenPartitions(t, rdb)
		return func(t *testing.T, c queuetest.Config) queue.Store {
			t.Helper()
			s, err := Open(context.Background(), Options{Client: rdb, Clock: c.Clock, Policy: c.Policy, Ceiling: c.Ceiling, Caps: c.Caps, StartLag: -1,
				// The arrivals are polled in real time: quick polls, for a
				// test that waits until the store has caught up with its
				// fake clock before it moves it (CaughtUp).
				Timing: Timing{Poll: time.Millisecond, Lease: conformanceLease}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	}})
}

// 100,000 tenants (10,000 under -race) each send one job: once the jobs are delivered and the
// idle time has passed, no bucket state is left in Redis (tenant hashes,
// gate lanes, active entries), so tenants that come and go do not fill it.
func TestRedisIdleTenantsExpire(t *testing.T) {
	testutil.SkipShort(t, "load test: 100,000 tenants on a redis-server, then their expiry")
	rdb := redisClient(t, 128)
	ctx := context.Background()
	s, err := Open(ctx, Options{Client: rdb, IdleTTL: time.Second, Policy: queuetest.Leaky20(10),
		// A lease long enough that a busy Redis (100,000 jobs at once) is
		// not a lost one.
		Timing:  Timing{Lease: 2 * time.Second},
		Ceiling: func(string) (string, *leaky.Policy) { return "sms", nil }})
	if err != nil {
		t.Fatal(err)
	}
	used := func() int64 {
		info, _ := rdb.Info(ctx, "memory").Result()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	tenants := 100_000
	if testutil.Race {
		tenants = 10_000 // the same path, without ten minutes of race detection
	}
	bucketKeys := func() int {
		n := 0
		for _, pattern := range []string{"throttler:*:tenant:*", "throttler:*:gate:tenant:*", "throttler:*:window:*", "throttler:*:waiting:*", "throttler:*:claimed:*"} {
			iter := rdb.Scan(ctx, 0, pattern, 10000).Iterator()
			for iter.Next(ctx) {
				n++
			}
		}
		for p := range s.partitions {
			n += int(rdb.ZCard(ctx, keysOf(p).active()).Val())
		}
		return n
	}
	empty := used()
	began := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(tenants); i = next.Add(1) - 1 {
				out, err := s.Enqueue(ctx, fmt.Sprintf("tenant-%d", i), []queue.NewJob{queuetest.Payload(int(i))})
				if err != nil || !out[0].Admitted() {
					t.Errorf("tenant %d: %+v %v", i, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	waiting := used()
	if n := bucketKeys(); n < tenants {
		t.Fatalf("%d bucket keys for %d tenants with a job waiting", n, tenants)
	}
	t.Logf("%d jobs admitted in %v; Redis memory per waiting job, one per tenant (its job hash, its line in the partition arrivals list, its tenant hash, waiting zset and active-set entry): %d bytes",
		tenants, time.Since(began).Round(time.Millisecond), (waiting-empty)/int64(tenants))

	var delivered atomic.Int64
	var sent sync.Map // job ids handed to the handler
	var calls atomic.Int64
	began = time.Now()
	stop := queuetest.Consume(t, s, queue.DefaultLead, func(ctx context.Context, j queue.Job) queue.Outcome {
		// Through the shared gate too: its lanes must expire as well.
		if _, err := s.PassGate(ctx, queue.GateRequest{Downstream: "sms", Tenant: j.Tenant, Policy: queuetest.Leaky20(10)(j.Tenant)}); err != nil {
			return queue.Outcome{Result: queue.Released}
		}
		// Distinct jobs: a busy machine can lose a lease, and the new
		// tenure sends its jobs in flight again (a busy CI run counted
		// 100,000 calls with 544 jobs still waiting).
		calls.Add(1)
		if _, again := sent.LoadOrStore(j.ID, true); !again {
			delivered.Add(1)
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: time.Now()}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for delivered.Load() < int64(tenants) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered in 3 minutes", delivered.Load(), tenants)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	t.Logf("%d delivered in %v (%d handler calls)", tenants, time.Since(began).Round(time.Millisecond), calls.Load())
	left := bucketKeys()
	deadline = time.Now().Add(30 * time.Second)
	for left > 0 {
		if time.Now().After(deadline) {
			counts := map[string]int{}
			for _, pattern := range []string{"throttler:*:tenant:*", "throttler:*:gate:tenant:*", "throttler:*:window:*", "throttler:*:waiting:*", "throttler:*:claimed:*"} {
				for iter := rdb.Scan(ctx, 0, pattern, 10000).Iterator(); iter.Next(ctx); {
					counts[pattern]++
				}
			}
			t.Fatalf("%d bucket keys still there 30 s after delivery (idle time 1 s): %v", left, counts)
		}
		time.Sleep(500 * time.Millisecond)
		left = bucketKeys()
	}
	t.Logf("every bucket key gone; what is left (jobs kept for store.retention): %d bytes per job", (used()-empty)/int64(tenants))
}

// The shared gate, which a downstream ceiling spanning partitions keeps: a
// grant that came back too late is given back and asked for again in one
// round trip, as often as needed, without costing the tenant an interval;
// the grant that is used stands; a pushback and an operator's hold stop
// sends at the gate. A tenant with no ceiling needs no gate: it goes at
// once, without a round trip.
func TestSharedGate(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	s, err := Open(ctx, Options{Client: rdb, Policy: queuetest.Leaky20(10),
		Ceiling: func(string) (string, *leaky.Policy) { return "sms", nil }})
	if err != nil {
		t.Fatal(err)
	}
	const T = 100 * time.Millisecond
	trips := &roundTrips{}
	rdb.AddHook(trips.hook())
	before := trips.n.Load()
	if a, err := s.PassGate(ctx, queue.GateRequest{Downstream: "sms", Tenant: "acme", Policy: leaky.Policy{Interval: T, Burst: 1, Capacity: 10}}); err != nil || a.Wait != 0 || !a.HeldUntil.IsZero() || trips.n.Load() != before {
		t.Fatalf("no ceiling: %+v %v after %d round trips, want a go without any", a, err, trips.n.Load()-before)
	} else if a.Again == nil {
		// The dispatcher gives back a grant it could not use within its
		// budget and asks again: a nil Again crashed the process.
		t.Fatal("no ceiling: a go without Again")
	} else if a, err := a.Again(ctx); err != nil || a.Wait != 0 || !a.HeldUntil.IsZero() || a.Again == nil || trips.n.Load() != before {
		t.Fatalf("no ceiling, asked again: %+v %v after %d round trips, want a go without any", a, err, trips.n.Load()-before)
	}
	wide := &leaky.Policy{Interval: time.Microsecond, Burst: 1000}
	req := queue.GateRequest{Downstream: "sms", Tenant: "acme", Policy: leaky.Policy{Interval: T, Burst: 1, Capacity: 10}, Ceiling: wide}
	goes := func(what string, a queue.GateAnswer, err error) queue.GateAnswer {
		t.Helper()
		if err != nil || a.Wait != 0 || !a.HeldUntil.IsZero() || a.Again == nil || a.Confirm == nil {
			t.Fatalf("%s: %+v %v, want go", what, a, err)
		}
		return a
	}
	// wrote confirms a grant's request written at once.
	wrote := func(a queue.GateAnswer) {
		t.Helper()
		if err := a.Confirm(ctx, 0, true); err != nil {
			t.Fatal(err)
		}
	}
	a, err := s.PassGate(ctx, req)
	a = goes("first send", a, err)
	var asked time.Time
	for i := range 3 {
		asked = time.Now()
		next, err := a.Again(ctx)
		a = goes(fmt.Sprintf("asked again (%d)", i+1), next, err)
	}
	// The grant is dated by Redis's clock when the last Again ran, and is
	// confirmed written at once after that (0 after the asking, as the
	// dispatcher counts it); the next send waits T from then. So it waits
	// T less at most what passed from that asking to its own answer (the
	// last Again's reply, the confirm and the ask): a busy CI run's race
	// pass took 4 ms over the Again's reply alone, and 6 ms over the other
	// two once.
	wrote(a)
	b, err := s.PassGate(ctx, req)
	if took := time.Since(asked); err != nil || b.Wait < T-took-time.Millisecond || b.Wait > T {
		t.Fatalf("the send after a used grant: %+v %v, want a wait of T = %v less at most the %v from asking again to this answer", b, err, T, took)
	}

	until := time.Now().Add(time.Minute)
	if err := s.holdLanes(ctx, "acme", until, false); err != nil {
		t.Fatal(err)
	}
	if h, err := s.PassGate(ctx, req); err != nil || h.HeldUntil.Sub(until).Abs() > time.Millisecond {
		t.Fatalf("after a pushback: %+v %v, want held until %v", h, err, until)
	}
	other := req
	other.Tenant = "beta"
	a, err = s.PassGate(ctx, other)
	wrote(goes("another tenant during acme's pushback", a, err))

	// A grant not yet confirmed holds the downstream's lane: the next send
	// asks again within a millisecond. Confirmed as written 40 ms late,
	// the lane moves on past that write: the next send waits until 40 ms
	// after the first grant (and the interval of the ceiling the first
	// asked under, 1 µs), less what has passed since it was asked for (a
	// busy race pass: 24 ms).
	askedFirst := time.Now()
	first, err := s.PassGate(ctx, queue.GateRequest{Downstream: "late", Tenant: "c1", Policy: req.Policy, Ceiling: wide})
	first = goes("a first send", first, err)
	next := queue.GateRequest{Downstream: "late", Tenant: "c2", Policy: req.Policy, Ceiling: &leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1}}
	if w, err := s.PassGate(ctx, next); err != nil || w.Wait <= 0 || w.Wait > time.Millisecond {
		t.Fatalf("while the first grant is not confirmed: %+v %v, want a wait of at most 1 ms", w, err)
	}
	if err := first.Confirm(ctx, 40*time.Millisecond, true); err != nil {
		t.Fatal(err)
	}
	const lateWrite = 40*time.Millisecond + time.Microsecond
	if w, err := s.PassGate(ctx, next); err != nil || w.Wait < lateWrite-time.Since(askedFirst)-time.Millisecond || w.Wait > lateWrite {
		t.Fatalf("after the first was confirmed written 40 ms late: %+v %v, want a wait of 40 ms less the %v since it was asked for", w, err, time.Since(askedFirst))
	}

	if _, err := s.Pause(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if h, err := s.PassGate(ctx, other); err != nil || h.HeldUntil.Before(time.Now().Add(100*365*24*time.Hour)) {
		t.Fatalf("after an operator's hold: %+v %v, want held until resumed", h, err)
	}
	if _, err := s.Resume(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if r, err := s.PassGate(ctx, other); err != nil || !r.HeldUntil.IsZero() || r.Wait > T {
		t.Fatalf("after resume: %+v %v, want a go, or a wait for beta's last interval", r, err)
	} else if r.Confirm != nil {
		wrote(r)
	}

	// Windows count the grants, across processes: the fourth send in "3
	// per 10 s" waits for the first to leave it; a grant given back
	// leaves it at once.
	win := queue.GateRequest{Downstream: "sms", Tenant: "win", Policy: leaky.Policy{Interval: time.Millisecond, Burst: 3, Capacity: 10,
		Windows: []leaky.Window{{N: 3, Length: 10 * time.Second}}}, Ceiling: wide}
	var last queue.GateAnswer
	for i := range 3 {
		last, err = s.PassGate(ctx, win)
		last = goes(fmt.Sprintf("send %d of 3 in the window", i+1), last, err)
		if i < 2 {
			wrote(last)
		}
	}
	if w, err := s.PassGate(ctx, win); err != nil || w.Wait < 9*time.Second {
		t.Fatalf("a fourth send in the window: %+v %v, want a wait of about 10 s", w, err)
	}
	last, err = last.Again(ctx)
	goes("the third send's grant given back and asked for again", last, err)
	if w, err := s.PassGate(ctx, win); err != nil || w.Wait < 9*time.Second {
		t.Fatalf("a fourth send after the give-back: %+v %v, want a wait of about 10 s", w, err)
	}
}
