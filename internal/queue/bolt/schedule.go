package bolt

import (
	"container/heap"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// schedule is the dispatcher's in-memory view of the due index: a min-heap
// of waiting jobs by real dispatch time, with lazy deletion (an entry counts
// only while waiting[id] still holds its time). It is changed only after the
// matching write commits, so it never shows a job that is not durable.
type schedule struct {
	heap     dueHeap
	waiting  map[string]dueEntry            // id -> entry of each waiting job not held by the dispatcher
	byTenant map[string]map[string]struct{} // tenant -> ids in waiting: to retime a tenant's jobs when it pauses
	expiry   dueHeap                        // waiting jobs with a deadline, by deadline (at = deadline)
}

type dueEntry struct {
	at       time.Time // real time: slot plus the tenant's pauses
	slot     time.Time // tenant time
	id       string
	tenant   string
	deadline time.Time // zero: none
	cost     int
	held     bool // handed over later than its time, for a downstream's ceiling
}

// entryOf is a waiting job's schedule entry at real time at.
func entryOf(j queue.Job, at time.Time) dueEntry {
	return dueEntry{at: at, slot: j.EffectiveSlot(), id: j.ID, tenant: j.Tenant, deadline: j.Deadline, cost: j.EffectiveCost()}
}

type dueHeap []dueEntry

func (h dueHeap) Len() int { return len(h) }

func (h dueHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].id < h[j].id
	}
	return h[i].at.Before(h[j].at)
}

func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *dueHeap) Push(x any) { *h = append(*h, x.(dueEntry)) }

func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (sc *schedule) add(e dueEntry) {
	sc.waiting[e.id] = e
	ids := sc.byTenant[e.tenant]
	if ids == nil {
		ids = map[string]struct{}{}
		sc.byTenant[e.tenant] = ids
	}
	ids[e.id] = struct{}{}
	heap.Push(&sc.heap, e)
	if !e.deadline.IsZero() {
		heap.Push(&sc.expiry, dueEntry{at: e.deadline, id: e.id})
	}
	sc.maybeCompact()
}

func (sc *schedule) maybeCompact() {
	if len(sc.heap)+len(sc.expiry) > 4*len(sc.waiting)+1024 {
		sc.compact()
	}
}

// compact rebuilds the heaps from the waiting jobs: stale entries (a hold
// retimes a tenant's jobs to never; finished jobs leave their deadline)
// would otherwise stay until they reach the top. Entries a fair queue holds
// may come out twice; the second is stale by then and skipped.
func (sc *schedule) compact() {
	sc.heap, sc.expiry = sc.heap[:0], sc.expiry[:0]
	for _, e := range sc.waiting {
		sc.heap = append(sc.heap, e)
		if !e.deadline.IsZero() {
			sc.expiry = append(sc.expiry, dueEntry{at: e.deadline, id: e.id})
		}
	}
	heap.Init(&sc.heap)
	heap.Init(&sc.expiry)
}

// readd puts a job back in the schedule at its time under the tenant's
// current pause (which may have changed while it was out).
func (s *Store) readd(e dueEntry) {
	if tm, ok := s.tenants[e.tenant]; ok {
		e.at = queue.RealAt(tm.rec.Pause, e.slot)
	}
	s.sched.add(e)
}

// expiring takes out the waiting jobs whose deadline is at or before now
// and whose time is after it: they can no longer be sent in time.
func (sc *schedule) expiring(now time.Time) []dueEntry {
	var out []dueEntry
	for sc.expiry.Len() > 0 && !sc.expiry[0].at.After(now) {
		x := heap.Pop(&sc.expiry).(dueEntry)
		if e, ok := sc.waiting[x.id]; ok && e.at.After(e.deadline) {
			sc.remove(e.id)
			out = append(out, e)
		}
	}
	return out
}

// nextExpiry is the earliest deadline of a waiting job (zero if none).
func (sc *schedule) nextExpiry() time.Time {
	for sc.expiry.Len() > 0 {
		if _, ok := sc.waiting[sc.expiry[0].id]; ok {
			return sc.expiry[0].at
		}
		heap.Pop(&sc.expiry)
	}
	return time.Time{}
}

// remove takes a job out of the schedule (its heap entry goes stale).
func (sc *schedule) remove(id string) (dueEntry, bool) {
	e, ok := sc.waiting[id]
	if !ok {
		return e, false
	}
	delete(sc.waiting, id)
	if ids := sc.byTenant[e.tenant]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(sc.byTenant, e.tenant)
		}
	}
	return e, true
}

// retime moves a tenant's waiting jobs to their real times under p: O(jobs
// waiting in memory), nothing written.
func (sc *schedule) retime(tenant string, p leaky.Pause) {
	for id := range sc.byTenant[tenant] {
		e := sc.waiting[id]
		if at := queue.RealAt(p, e.slot); !at.Equal(e.at) {
			e.at = at
			sc.waiting[id] = e
			heap.Push(&sc.heap, e)
		}
	}
	sc.maybeCompact()
}

// peek drops stale entries and returns the earliest waiting one.
func (sc *schedule) peek() (dueEntry, bool) {
	for sc.heap.Len() > 0 {
		e := sc.heap[0]
		if w, ok := sc.waiting[e.id]; ok && w.at.Equal(e.at) {
			return e, true
		}
		heap.Pop(&sc.heap)
	}
	return dueEntry{}, false
}
