package owner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// A manager that crashes (its context cancelled: no Drain, no release)
// has its partitions taken over only once their leases expired in Redis,
// about a lease after its last renewal.
func TestCrashedOwnerTakenOverAfterItsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8, false)
	a, b := e.start("a", nil), e.start("b", nil)
	e.waitSteady("two managers to share the partitions", 10*testLease, a, b)
	held := partitionsOf(b)
	crashed := time.Now()
	b.crash()
	b.renewer.Stop() // wait until no renewal of b's is under way
	b.balancer.Stop()
	<-b.watchDone
	ctx := context.Background()
	expiry := map[int]time.Time{}
	for p, epoch := range held {
		v, _ := e.rdb.Get(ctx, leaseKey(p)).Result()
		d, _ := e.rdb.PTTL(ctx, leaseKey(p)).Result()
		if v != token("b", epoch) || d <= 0 {
			t.Fatalf("partition %d right after b crashed: lease %q, %v left; want b's, still running", p, v, d)
		}
		expiry[p] = time.Now().Add(d)
		if lost := e.rec.find("lost", "b", p); len(lost) == 0 || lost[len(lost)-1].at.Before(crashed) {
			t.Errorf("b's user was not told it lost partition %d when its context ended", p)
		}
	}
	e.waitSteady("a to take over b's partitions", 5*testLease, a)
	var first, last time.Duration
	for p := range held {
		acq := e.rec.find("acquired", "a", p)
		at := acq[len(acq)-1].at
		if at.Before(expiry[p].Add(-5 * time.Millisecond)) {
			t.Errorf("partition %d taken over %v before b's lease expired in Redis", p, expiry[p].Sub(at))
		}
		took := at.Sub(crashed)
		if first == 0 || took < first {
			first = took
		}
		last = max(last, took)
	}
	t.Logf("takeover after a crash (lease %v, balance %v): %v to %v after it, each after the lease had expired", testLease, testBalance, first.Round(time.Millisecond), last.Round(time.Millisecond))
	if last > testLease+testBalance+slack() {
		t.Errorf("the last takeover took %v", last)
	}
}

// An owner whose renewals stop (Redis unreachable from it, or it froze)
// reports each partition Lost before its lease can expire in Redis, on
// its own clock; after the takeover its writes with the old epoch are
// refused; once it renews again it rejoins with new epochs.
func TestFrozenOwnerStopsBeforeItsLeaseExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8, false)
	type atLost struct {
		lease string
		left  time.Duration
		at    time.Time
	}
	var mu sync.Mutex
	seen := map[int]atLost{}
	a := e.start("a", nil)
	b := e.start("b", func(o *Options) {
		record := o.Lost
		o.Lost = func(p int) {
			ctx := context.Background()
			v, _ := e.rdb.Get(ctx, leaseKey(p)).Result()
			d, _ := e.rdb.PTTL(ctx, leaseKey(p)).Result()
			mu.Lock()
			seen[p] = atLost{v, d, time.Now()}
			mu.Unlock()
			record(p)
		}
	})
	e.waitSteady("two managers to share the partitions", 10*testLease, a, b)
	held := partitionsOf(b)
	fences := map[int]Fence{}
	for p := range held {
		fences[p], _ = b.Fence(p)
	}
	frozen := time.Now()
	b.hooks.frozen.Store(true)
	testutil.WaitFor(t, 3*testLease, "b to report its partitions lost", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(held)
	})
	for p, epoch := range held {
		s := seen[p]
		if s.lease != fences[p].Token() || s.left <= 0 {
			t.Errorf("partition %d: Lost with the lease %q, %v left: want b's, not expired yet", p, s.lease, s.left)
		}
		t.Logf("partition %d: Lost %v after the freeze, its lease with %v left in Redis", p, s.at.Sub(frozen).Round(time.Millisecond), s.left)
		if b.Holds(p, epoch) {
			t.Errorf("b still holds partition %d after Lost", p)
		}
	}
	e.waitSteady("a to take over", 5*testLease, a)
	for p, f := range fences {
		_, err := f.Run(context.Background(), e.rdb, countScript, []string{KeyPrefix(p) + "outcomes"})
		var fe *FencedError
		if !errors.As(err, &fe) || !errors.Is(err, ErrFenced) {
			t.Fatalf("partition %d: the stale owner's write: %v, want refused", p, err)
		}
		if w, epoch, _ := parseToken(fe.Holder); w != "a" || epoch <= f.Epoch {
			t.Errorf("partition %d: refused, the lease held by %q: want a's, in a later epoch than %d", p, fe.Holder, f.Epoch)
		}
	}
	b.hooks.frozen.Store(false)
	e.waitSteady("b to rejoin", 5*testLease, a, b)
	for p, epoch := range partitionsOf(b) {
		if old, ok := held[p]; ok && epoch <= old {
			t.Errorf("partition %d: b back in epoch %d, not after its old %d", p, epoch, old)
		}
	}
}

// A whole process frozen (no renewal, no timer either): Holds, which a
// sender checks before each send, refuses from the deadline on, while
// Redis still has the lease; Lost follows once the timer runs again.
func TestHoldsEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, false)
	a := e.start("a", nil)
	e.waitSteady("a to hold both partitions", 10*testLease, a)
	f, _ := a.Fence(0)
	f1, _ := a.Fence(1)
	a.hooks.blind.Store(true)
	a.hooks.frozen.Store(true)
	// Each partition's deadline is its own (two acquires a moment apart,
	// if frozen before a renewal gave both the same): wait for both.
	testutil.WaitFor(t, 2*testLease, "Holds to refuse", func() bool { return !a.Holds(0, f.Epoch) && !a.Holds(1, f1.Epoch) })
	ctx := context.Background()
	v, _ := e.rdb.Get(ctx, leaseKey(0)).Result()
	d, _ := e.rdb.PTTL(ctx, leaseKey(0)).Result()
	if v != f.Token() || d <= 0 {
		t.Errorf("when Holds refused, the lease was %q with %v left: want a's, not expired", v, d)
	}
	t.Logf("Holds refused with %v of the lease left in Redis", d)
	if len(e.rec.find("lost", "a", 0)) != 0 {
		t.Fatal("Lost came while the watchdog was frozen")
	}
	if _, ok := a.Fence(0); ok || len(a.Owned()) != 0 {
		t.Errorf("past the deadline: Fence %v, Owned %v; want neither", ok, a.Owned())
	}
	a.hooks.blind.Store(false)
	testutil.WaitFor(t, testLease, "Lost once the timer runs", func() bool {
		return len(e.rec.find("lost", "a", 0)) == 1 && len(e.rec.find("lost", "a", 1)) == 1
	})
	a.hooks.frozen.Store(false)
	e.waitSteady("a to take its partitions again", 5*testLease, a)
}

// Redis restarted, with its data (AOF) or without, at once or after an
// outage that outlasts every owner's deadline: the owners recover, never two at once.
// Without data every partition is held vacant for a lease first, and the
// epochs still grow; after a long outage every owner has stopped (Lost)
// before its lease could expire.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		aof, long bool
	}{{"aof", true, false}, {"no persistence", false, false}, {"aof, down until every owner stopped", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 8, tc.aof)
			a, b, c := e.start("a", nil), e.start("b", nil), e.start("c", nil)
			e.waitSteady("three managers to share the partitions", 10*testLease, a, b, c)
			leases, _ := ReadLeases(context.Background(), e.rdb, e.P)
			var top int64
			for _, l := range leases {
				top = max(top, l.Epoch)
			}
			down := time.Now()
			if tc.long {
				e.srv.Kill()
				testutil.WaitFor(t, 3*testLease, "every owner to stop", func() bool { return lostSince(e, down) == e.P })
			}
			e.srv.Restart()
			restarted := time.Now()
			e.waitSteady("the owners to recover", 10*testLease, a, b, c)
			testutil.WaitFor(t, 5*testLease, "a renewal of every lease after the restart", func() bool {
				return renewedSince(restarted, a, b, c)
			})
			lost := lostSince(e, down)
			t.Logf("%s: Redis down %v; every partition owned and renewed again %v after it was back; %d partitions lost on the way",
				tc.name, restarted.Sub(down).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond), lost)
			after, _ := ReadLeases(context.Background(), e.rdb, e.P)
			for _, l := range after {
				if !tc.aof && l.Epoch <= top {
					t.Errorf("partition %d: epoch %d after Redis lost its data, not above the %d before", l.Partition, l.Epoch, top)
				}
			}
			if (!tc.aof || tc.long) && lost != e.P {
				t.Errorf("%d partitions lost, want all %d", lost, e.P)
			}
		})
	}
}

// lostSince counts the partitions reported Lost since t.
func lostSince(e *env, t time.Time) int {
	lost := map[int]bool{}
	for _, ev := range e.rec.all() {
		if ev.kind == "lost" && ev.at.After(t) {
			lost[ev.p] = true
		}
	}
	return len(lost)
}

// renewedSince is whether every tenure of the managers was renewed (or
// begun) by a request sent after since.
func renewedSince(since time.Time, ms ...*tm) bool {
	for _, w := range ms {
		w.mu.Lock()
		for _, t := range w.held {
			if t.deadline.Before(since.Add(testLease - testLease/5)) {
				w.mu.Unlock()
				return false
			}
		}
		w.mu.Unlock()
	}
	return true
}
