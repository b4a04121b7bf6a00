package bolt

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// The schedule's heap hands entries back by time, then id.
func TestSlimHeapOrder(t *testing.T) {
	t.Parallel()
	var h slimHeap
	var want []slimEntry
	for i := range 500 {
		e := slimEntry{at: int64((i * 7919) % 97), id: jobKey{byte(i % 5), byte(i)}}
		h.push(e)
		want = append(want, e)
	}
	slices.SortFunc(want, func(a, b slimEntry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), bytes.Compare(a.id[:], b.id[:]))
	})
	for i, w := range want {
		if i == 250 { // half way, as compact does
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
func newTestSchedule() *schedule {
	return &schedule{waiting: map[jobKey]slimEntry{}, byTenant: map[uint32]map[jobKey]struct{}{}}
}

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

// A backlog's peak does not stay in memory once it drains: the schedule
// builds its maps and heaps anew at a quarter of the peak (Go's maps keep
// their buckets). 200,000 waiting jobs, then all taken out: the live heap
// comes back to within a tenth of what the peak added.
func TestScheduleMemoryFollowsTheBacklogDown(t *testing.T) {
	const jobs = 200_000
	sc := newTestSchedule()
	ids := make([]string, jobs)
	base := liveHeap()
	for i := range jobs {
		e := testEntry(i)
		ids[i] = e.id
		sc.add(e)
	}
	ids = slices.Clip(ids)
	peak := liveHeap()
	for _, id := range ids {
		if _, ok := sc.remove(id); !ok {
			t.Fatalf("job %s not in the schedule", id)
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

// Shrinking loses nothing and keeps the order: jobs taken out earliest
// first while the schedule shrinks under them come out each once, in time
// order, and those with a deadline still expire.
func TestScheduleShrinksWithoutLosingAJob(t *testing.T) {
	t.Parallel()
	const jobs = 20_000
	sc := newTestSchedule()
	for i := range jobs {
		sc.add(testEntry(i))
	}
	seen, shrinks, last := map[string]bool{}, 0, int64(math.MinInt64)
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
		peak := sc.peak
		if _, ok := sc.remove(e.id); !ok || seen[e.id] {
			t.Fatalf("job %s: removed %v, seen before %v", e.id, ok, seen[e.id])
		}
		seen[e.id] = true
		if sc.peak < peak {
			shrinks++
		}
	}
	if shrinks == 0 {
		t.Fatal("the schedule never shrank")
	}
	// What is left expires by its deadlines, as before any shrink.
	left := sc.len()
	expired := len(sc.expiring(time.Unix(0, 0).Add(200 * time.Hour)))
	withDeadline := 0
	for _, e := range sc.waiting {
		if e.deadline != noDeadline {
			withDeadline++
		}
	}
	if withDeadline != 0 || expired == 0 || expired+sc.len() != left {
		t.Fatalf("%d left: %d expired, %d still waiting, %d of them with a deadline", left, expired, sc.len(), withDeadline)
	}
}
