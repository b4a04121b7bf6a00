package bolt

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// The heap hands entries back by deadline, then id.
func TestMinHeapOrder(t *testing.T) {
	t.Parallel()
	var h minHeap[expiryEntry]
	var want []expiryEntry
	for i := range 500 {
		x := expiryEntry{deadline: int64((i * 7919) % 97), id: jobKey{byte(i % 5), byte(i)}}
		h.push(x)
		want = append(want, x)
	}
	slices.SortFunc(want, func(a, b expiryEntry) int {
		return cmp.Or(cmp.Compare(a.deadline, b.deadline), bytes.Compare(a.id[:], b.id[:]))
	})
	for i, w := range want {
		if i == 250 { // half way, as a rebuild does
			h.init()
		}
		if got := h.pop(); got != w {
			t.Fatalf("pop %d: %+v, want %+v", i, got, w)
		}
	}
	if len(h) != 0 {
		t.Fatalf("%d left", len(h))
	}
}

// newTestSchedule is an empty schedule as the store makes one.
func newTestSchedule() *schedule { return &schedule{lines: map[string]*line{}} }

// testEntry is waiting job i of 100 tenants, at a time that mixes the
// order of admission; every third has a deadline just before its time (a
// pause moved it past it: it expires at its deadline).
func testEntry(i int) dueEntry {
	at := time.Unix(0, int64((i*7919)%100_003)*int64(time.Millisecond))
	e := dueEntry{at: at, slot: at, id: queue.NewID(at), tenant: fmt.Sprintf("t%d", i%100), cost: 1}
	if i%3 == 0 {
		e.deadline = at.Add(-time.Millisecond)
	}
	return e
}

// A backlog's peak does not stay in memory once it drains: a line's tree
// gives its nodes back as its jobs leave, and an empty line goes.
// 200,000 waiting jobs, then all taken out in no order: the live heap comes
// back to within a tenth of what the peak added.
func TestScheduleMemoryFollowsTheBacklogDown(t *testing.T) {
	const jobs = 200_000
	sc := newTestSchedule()
	entries := make([]dueEntry, jobs)
	base := liveHeap()
	for i := range jobs {
		entries[i] = testEntry(i)
		sc.add(entries[i])
	}
	peak := liveHeap()
	for _, e := range entries {
		if _, ok := sc.remove(e.tenant, e.slot, e.id); !ok {
			t.Fatalf("job %s not in the schedule", e.id)
		}
	}
	after := liveHeap()
	added := peak - base
	t.Logf("live heap: %d MB at the start, %d MB at the peak of %d jobs, %d MB after they left", base>>20, peak>>20, jobs, after>>20)
	if added < 10<<20 {
		t.Fatalf("the peak added only %d bytes: the test measures nothing", added)
	}
	if after-base > added/10 {
		t.Fatalf("after the backlog left, the heap holds %d bytes more than at the start (the peak added %d)", after-base, added)
	}
	runtime.KeepAlive(sc)
}

// Draining loses nothing and keeps the order: jobs taken out earliest
// first come out each once, in time order, and those with a deadline still
// expire.
func TestScheduleDrainsWithoutLosingAJob(t *testing.T) {
	t.Parallel()
	const jobs = 20_000
	sc := newTestSchedule()
	for i := range jobs {
		sc.add(testEntry(i))
	}
	seen, last := map[string]bool{}, int64(math.MinInt64)
	for sc.len() > jobs/10 {
		e, ok := sc.peek()
		if !ok {
			t.Fatal("peek found nothing with jobs waiting")
		}
		if nanos(e.at) < last {
			t.Fatalf("job %s at %v came after one at %v", e.id, e.at, fromNanos(last))
		}
		last = nanos(e.at)
		sc.pop()
		if _, ok := sc.remove(e.tenant, e.slot, e.id); !ok || seen[e.id] {
			t.Fatalf("job %s: removed %v, seen before %v", e.id, ok, seen[e.id])
		}
		seen[e.id] = true
	}
	// What is left expires by its deadlines.
	left := sc.len()
	expired := len(sc.expiring(time.Unix(0, 0).Add(200 * time.Hour)))
	withDeadline := 0
	for _, l := range sc.lines {
		sc.tenantEntries(l.tenant, func(e dueEntry) {
			if !e.deadline.IsZero() {
				withDeadline++
			}
		})
	}
	if withDeadline != 0 || expired == 0 || expired+sc.len() != left {
		t.Fatalf("%d left: %d expired, %d still waiting, %d of them with a deadline", left, expired, sc.len(), withDeadline)
	}
}

// The schedule against a plain list of what waits, through random
// additions, removals, pops, retimings and expiries: peek gives a job of
// the earliest time among those not popped, a tenant's jobs come out in
// slot order, every lookup agrees, and nothing is lost or counted twice.
func TestScheduleAgainstAList(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		sc := newTestSchedule()
		type job struct {
			e      dueEntry
			popped bool
			// watched: its deadline is yet to be looked at (once passed, a
			// job then still due in time is the dispatcher's to expire).
			watched bool
		}
		ref := map[string]*job{}          // by id
		pause := map[string]leaky.Pause{} // a tenant's jobs are timed under its pause
		base := time.Unix(1_000_000, 0)
		tenants := []string{"a", "b", "c"}
		var removed []dueEntry
		n := 0
		for range rapid.IntRange(1, 200).Draw(rt, "steps") {
			switch rapid.IntRange(0, 11).Draw(rt, "op") {
			case 0, 1, 2, 3: // admit (at any slot: a retry or a booking may come before others)
				tenant := rapid.SampledFrom(tenants).Draw(rt, "tenant")
				slot := base.Add(time.Duration(rapid.IntRange(0, 50).Draw(rt, "slot")) * time.Second)
				n++
				e := dueEntry{at: rules.RealAt(pause[tenant], slot), slot: slot, id: queue.NewID(base.Add(time.Duration(n))), tenant: tenant, cost: 1}
				if rapid.Bool().Draw(rt, "deadline") {
					e.deadline = e.at.Add(time.Duration(rapid.IntRange(-5, 5).Draw(rt, "by")) * time.Second)
				}
				sc.add(e)
				ref[e.id] = &job{e: e, watched: !e.deadline.IsZero()}
			case 4, 5: // remove one
				if len(ref) == 0 {
					continue
				}
				ids := slices.Sorted(maps.Keys(ref))
				j := ref[rapid.SampledFrom(ids).Draw(rt, "id")]
				slot := j.e.slot
				if rapid.Bool().Draw(rt, "stale") {
					slot = slot.Add(-time.Second) // a record older than the schedule
				}
				if got, ok := sc.remove(j.e.tenant, slot, j.e.id); !ok || got.id != j.e.id {
					rt.Fatalf("remove %s: %v %+v", j.e.id, ok, got)
				}
				delete(ref, j.e.id)
				removed = append(removed, j.e)
			case 10: // one taken out comes back (a hand-over that failed)
				if len(removed) == 0 {
					continue
				}
				e := removed[len(removed)-1]
				removed = removed[:len(removed)-1]
				e.at = rules.RealAt(pause[e.tenant], e.slot)
				sc.add(e)
				ref[e.id] = &job{e: e, watched: !e.deadline.IsZero()}
			case 11: // a restart: each tenant's line filled at once, nothing popped
				sc = newTestSchedule()
				for _, tenant := range tenants {
					var line []slimEntry
					for _, j := range ref {
						if j.e.tenant == tenant {
							k, _ := keyOf(j.e.id)
							line = append(line, slim(j.e, k))
							j.popped, j.watched = false, !j.e.deadline.IsZero()
						}
					}
					// In any order: a restart may move a job past a booking.
					line = rapid.Permutation(line).Draw(rt, "order")
					sc.fill(tenant, line)
				}
			case 6, 7: // peek and pop
				e, ok := sc.peek()
				var first *job
				for _, j := range ref {
					if !j.popped && (first == nil || j.e.at.Before(first.e.at)) {
						first = j
					}
				}
				if ok != (first != nil) {
					rt.Fatalf("peek: %v, want %v", ok, first != nil)
				}
				if !ok {
					continue
				}
				if !e.at.Equal(first.e.at) {
					rt.Fatalf("peek gave %s at %v, but %s waits at %v", e.id, e.at, first.e.id, first.e.at)
				}
				for _, j := range ref {
					if !j.popped && j.e.tenant == e.tenant && (j.e.slot.Before(e.slot) || j.e.slot.Equal(e.slot) && j.e.id < e.id) {
						rt.Fatalf("peek gave %s of slot %v before %s of slot %v", e.id, e.slot, j.e.id, j.e.slot)
					}
				}
				ref[e.id].popped = true
				sc.pop()
			case 8: // a pause moves a tenant's times
				tenant := rapid.SampledFrom(tenants).Draw(rt, "tenant")
				until := base.Add(time.Duration(rapid.IntRange(0, 60).Draw(rt, "until")) * time.Second)
				p := leaky.Pause{Until: until, Shift: time.Duration(rapid.IntRange(0, 10).Draw(rt, "shift")) * time.Second}
				pause[tenant] = p
				sc.retime(tenant, p)
				for _, j := range ref {
					if at := rules.RealAt(p, j.e.slot); j.e.tenant == tenant && !at.Equal(j.e.at) {
						j.e.at, j.popped = at, false
					}
				}
			case 9: // expire
				now := base.Add(time.Duration(rapid.IntRange(0, 60).Draw(rt, "now")) * time.Second)
				got := map[string]bool{}
				for _, e := range sc.expiring(now) {
					got[e.id] = true
				}
				for id, j := range ref {
					looked := j.watched && !j.e.deadline.After(now)
					want := looked && j.e.at.After(j.e.deadline)
					if looked {
						j.watched = false
					}
					if want != got[id] {
						rt.Fatalf("job %s (at %v, deadline %v) at %v: expired %v, want %v", id, j.e.at, j.e.deadline, now, got[id], want)
					}
					if want {
						delete(ref, id)
					}
				}
			}
			if sc.len() != len(ref) {
				rt.Fatalf("%d waiting, want %d", sc.len(), len(ref))
			}
			for id, j := range ref {
				got, ok := sc.get(j.e.tenant, j.e.slot, id)
				if !ok || !got.at.Equal(j.e.at) || !got.slot.Equal(j.e.slot) || !got.deadline.Equal(j.e.deadline) || !sc.current(j.e) {
					rt.Fatalf("job %s: %v %+v, want %+v", id, ok, got, j.e)
				}
			}
		}
	})
}
