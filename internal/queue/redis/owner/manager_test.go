package owner

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// Three managers share 16 partitions 6/5/5 and, sampled for a second,
// every partition has exactly one owner (the leases in Redis, each held by
// a manager that holds it in that epoch). A fourth joins and gets its
// share within a few seconds: the others give back their surplus, each
// drained before its release, never two owners at once. One stops: its
// partitions are drained, released and taken by the others.
func TestManagersShareJoinAndLeave(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16, false)
	a, b, c := e.start("a", nil), e.start("b", nil), e.start("c", nil)
	took := e.waitSteady("three managers to share the partitions", 10*testLease, a, b, c)
	t.Logf("three managers hold all 16 partitions %v after they started (a lease of it is the vacancy of a new Redis)", took.Round(time.Millisecond))
	tick := time.NewTicker(20 * time.Millisecond) // sampling a steady state for a second, not waiting for one
	defer tick.Stop()
	for range 50 {
		<-tick.C
		counts, ok := e.steady(a, b, c)
		if !ok {
			t.Fatalf("not one owner per partition, or unbalanced: %v", counts)
		}
		if !slices.Equal(slices.Sorted(maps.Values(counts)), []int{5, 5, 6}) {
			t.Fatalf("counts %v, want 6/5/5", counts)
		}
	}

	before := map[string]map[int]int64{"a": partitionsOf(a), "b": partitionsOf(b), "c": partitionsOf(c)}
	d := e.start("d", nil)
	took = e.waitSteady("the fourth to get its share", 10*testLease, a, b, c, d)
	t.Logf("a fourth manager has its share %v after it started", took.Round(time.Millisecond))
	if counts, _ := e.steady(a, b, c, d); !slices.Equal(slices.Sorted(maps.Values(counts)), []int{4, 4, 4, 4}) {
		t.Fatalf("counts %v, want 4 each", counts)
	}
	if time.Duration(took) > 3*time.Second+slack() {
		t.Errorf("the fourth took %v to get its share", took)
	}
	for p := range partitionsOf(d) {
		for id, held := range before {
			if _, ok := held[p]; !ok {
				continue
			}
			drained := e.rec.find("drained", id, p)
			acquired := e.rec.find("acquired", "d", p)
			if len(drained) == 0 || len(acquired) == 0 || !drained[len(drained)-1].at.Before(acquired[0].at) {
				t.Errorf("partition %d went from %s to d without a Drain before", p, id)
			}
		}
	}

	held := partitionsOf(b)
	stopped := time.Now()
	b.Stop()
	took = e.waitSteady("the others to take b's partitions", 10*testLease, a, c, d)
	t.Logf("b stopped: its %d partitions held by the others %v later", len(held), took.Round(time.Millisecond))
	for p := range held {
		drained := e.rec.find("drained", "b", p)
		if len(drained) == 0 || drained[len(drained)-1].at.Before(stopped) {
			t.Errorf("b stopped without draining partition %d", p)
			continue
		}
		var next []event
		for _, ev := range e.rec.find("acquired", "", p) {
			if ev.at.After(stopped) {
				next = append(next, ev)
			}
		}
		if len(next) == 0 {
			t.Errorf("partition %d: no new owner after b stopped", p)
		} else {
			t.Logf("partition %d: %s took it %v after b drained it", p, next[0].worker, next[0].at.Sub(drained[len(drained)-1].at).Round(time.Millisecond))
		}
	}
	for _, ev := range e.rec.all() {
		if ev.kind == "lost" {
			t.Errorf("%s lost partition %d", ev.worker, ev.p)
		}
	}
	if len(b.Owned()) != 0 {
		t.Errorf("b holds %v after Stop", b.Owned())
	}
	testutil.WaitFor(t, time.Second, "b to leave the live workers", func() bool {
		return e.rdb.ZScore(t.Context(), workersKey, "b").Err() != nil
	})
}
