package bolt

import (
	"encoding/base32"
	"math"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// schedule is the dispatcher's in-memory view of the waiting jobs: a
// min-heap by real dispatch time, with lazy deletion (an entry counts only
// while waiting[id] still holds its time). It is changed only after the
// matching write commits, so it never shows a job that is not durable.
//
// It holds what scheduling needs and nothing else (the file has the rest):
// per job an id, a tenant number, its times and cost, 56 bytes, in
// structures without pointers, so that the collector does not scan them
// (BenchmarkHeapPerWaitingJob measures the whole per waiting job).
type schedule struct {
	heap     slimHeap
	waiting  map[jobKey]slimEntry           // each waiting job not held by the dispatcher
	byTenant map[uint32]map[jobKey]struct{} // tenant -> ids in waiting: to retime a tenant's jobs when it pauses
	expiry   slimHeap                       // waiting jobs with a deadline, by deadline (at = deadline)
	names    tenantNames
	// peak is the most jobs waiting since the structures were last built
	// to size (shrink): Go's maps never give back their buckets, nor a
	// slice its array, so a backlog's peak would stay in memory after it
	// drained.
	peak int
}

// dueEntry is a waiting job's entry as the rest of the store uses it.
type dueEntry struct {
	at       time.Time // real time: slot plus the tenant's pauses
	slot     time.Time // tenant time
	id       string
	tenant   string
	deadline time.Time // zero: none
	cost     int
	held     bool // handed over later than its time, for a downstream's ceiling
	// scheduled: booked at its not_before (queue.StateScheduled), counted
	// in its tenant's scheduled jobs, not in its depth.
	scheduled bool
	// notBefore: it has a not_before (in its record only, to keep entries
	// small): a re-pacing reads it (Repace).
	notBefore bool
}

// wakeBy is when the dispatcher must look at e, as a slot (it wakes a lead
// before one): e's time, or its deadline if that comes first (so that it
// is expired then, even while its tenant is held).
func (e dueEntry) wakeBy() time.Time {
	if e.deadline.IsZero() {
		return e.at
	}
	return clock.Earliest(e.at, e.deadline.Add(queue.DefaultLead))
}

// entryOf is a waiting job's schedule entry at real time at.
func entryOf(j queue.Job, at time.Time) dueEntry {
	return dueEntry{at: at, slot: j.EffectiveSlot(), id: j.ID, tenant: j.Tenant, deadline: j.Deadline, cost: j.EffectiveCost(), scheduled: j.State == queue.StateScheduled, notBefore: !j.NotBefore.IsZero()}
}

// jobKey is a job id in its 16 bytes (ids are base32, queue.NewID).
type jobKey [16]byte

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// keyOf is the key of a job id; false if id is not one queue.NewID makes.
func keyOf(id string) (jobKey, bool) {
	var k jobKey
	if len(id) != idEncoding.EncodedLen(len(k)) {
		return k, false
	}
	n, err := idEncoding.Decode(k[:], []byte(id))
	return k, err == nil && n == len(k)
}

func (k jobKey) String() string { return idEncoding.EncodeToString(k[:]) }

// slimEntry is how the schedule keeps an entry: times in Unix nanoseconds
// (clock.Never and every slot within the horizon fit), the tenant by number.
type slimEntry struct {
	at, slot  int64
	deadline  int64 // noDeadline: none
	id        jobKey
	tenant    uint32
	cost      int32
	held      bool
	scheduled bool
	notBefore bool
}

const noDeadline = math.MinInt64

func nanos(t time.Time) int64 {
	switch {
	case t.After(maxNanos):
		return math.MaxInt64
	case t.Before(minNanos):
		return math.MinInt64 + 1
	}
	return t.UnixNano()
}

var minNanos, maxNanos = time.Unix(0, math.MinInt64+1), time.Unix(0, math.MaxInt64)

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// tenantNames numbers the tenants that have entries; a number is reused once
// its tenant has none.
type tenantNames struct {
	byName map[string]uint32
	names  []string
	refs   []int32
	free   []uint32
}

func (tn *tenantNames) ref(name string) uint32 {
	n, ok := tn.byName[name]
	if !ok {
		if tn.byName == nil {
			tn.byName = map[string]uint32{}
		}
		if k := len(tn.free); k > 0 {
			n, tn.free = tn.free[k-1], tn.free[:k-1]
			tn.names[n], tn.refs[n] = name, 0
		} else {
			n = uint32(len(tn.names))
			tn.names, tn.refs = append(tn.names, name), append(tn.refs, 0)
		}
		tn.byName[name] = n
	}
	tn.refs[n]++
	return n
}

func (tn *tenantNames) unref(n uint32) {
	if tn.refs[n]--; tn.refs[n] == 0 {
		delete(tn.byName, tn.names[n])
		tn.names[n] = ""
		tn.free = append(tn.free, n)
	}
}

func (sc *schedule) fat(e slimEntry) dueEntry {
	d := dueEntry{at: fromNanos(e.at), slot: fromNanos(e.slot), id: e.id.String(), tenant: sc.names.names[e.tenant], cost: int(e.cost), held: e.held, scheduled: e.scheduled, notBefore: e.notBefore}
	if e.deadline != noDeadline {
		d.deadline = fromNanos(e.deadline)
	}
	return d
}

// slimHeap is a min-heap of entries by time, then id (the order ids sort
// in). Its own, not container/heap's: that boxes every entry pushed or
// popped in an interface, an allocation each.
type slimHeap []slimEntry

func (h slimHeap) less(i, j int) bool {
	if h[i].at == h[j].at {
		return string(h[i].id[:]) < string(h[j].id[:])
	}
	return h[i].at < h[j].at
}

func (h *slimHeap) push(e slimEntry) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

// pop removes and returns the earliest entry (the heap must not be empty).
func (h *slimHeap) pop() slimEntry {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	q.down(0)
	*h = q
	return top
}

func (h slimHeap) down(i int) {
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h.less(l, least) {
			least = l
		}
		if r < len(h) && h.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

// init orders h as a heap.
func (h slimHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (sc *schedule) add(e dueEntry) {
	k, ok := keyOf(e.id)
	if !ok {
		panic("bolt: schedule.add of an id not made by queue.NewID: " + e.id) // recover refuses such files
	}
	if old, ok := sc.waiting[k]; ok {
		sc.names.unref(old.tenant) // replaced: counted once
	}
	se := slimEntry{at: nanos(e.at), slot: nanos(e.slot), deadline: noDeadline, id: k, tenant: sc.names.ref(e.tenant), cost: int32(min(e.cost, math.MaxInt32)), held: e.held, scheduled: e.scheduled, notBefore: e.notBefore}
	if !e.deadline.IsZero() {
		se.deadline = nanos(e.deadline)
	}
	sc.waiting[k] = se
	sc.peak = max(sc.peak, len(sc.waiting))
	ids := sc.byTenant[se.tenant]
	if ids == nil {
		ids = map[jobKey]struct{}{}
		sc.byTenant[se.tenant] = ids
	}
	ids[k] = struct{}{}
	sc.heap.push(se)
	if se.deadline != noDeadline {
		sc.expiry.push(slimEntry{at: se.deadline, id: k})
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
	for k, e := range sc.waiting {
		sc.heap = append(sc.heap, e)
		if e.deadline != noDeadline {
			sc.expiry = append(sc.expiry, slimEntry{at: e.deadline, id: k})
		}
	}
	sc.heap.init()
	sc.expiry.init()
}

// readd puts a job back in the schedule at its time under the tenant's
// current pause (which may have changed while it was out).
func (s *Store) readd(e dueEntry) {
	if tm, ok := s.tenants[e.tenant]; ok {
		e.at = rules.RealAt(tm.rec.Pause, e.slot)
	}
	s.sched.add(e)
}

// expiring takes out the waiting jobs whose deadline is at or before now
// and whose time is after it: they can no longer be sent in time.
func (sc *schedule) expiring(now time.Time) []dueEntry {
	var out []dueEntry
	n := nanos(now)
	for len(sc.expiry) > 0 && sc.expiry[0].at <= n {
		x := sc.expiry.pop()
		if e, ok := sc.waiting[x.id]; ok && e.at > e.deadline {
			out = append(out, sc.fat(e))
			sc.remove(out[len(out)-1].id)
		}
	}
	return out
}

// nextExpiry is the earliest deadline of a waiting job (zero if none).
func (sc *schedule) nextExpiry() time.Time {
	for len(sc.expiry) > 0 {
		if _, ok := sc.waiting[sc.expiry[0].id]; ok {
			return fromNanos(sc.expiry[0].at)
		}
		sc.expiry.pop()
	}
	return time.Time{}
}

// lookup returns a waiting job's key and entry.
func (sc *schedule) lookup(id string) (jobKey, slimEntry, bool) {
	k, ok := keyOf(id)
	if !ok {
		return k, slimEntry{}, false
	}
	e, ok := sc.waiting[k]
	return k, e, ok
}

// get returns a waiting job's entry.
func (sc *schedule) get(id string) (dueEntry, bool) {
	_, e, ok := sc.lookup(id)
	if !ok {
		return dueEntry{}, false
	}
	return sc.fat(e), true
}

// current reports whether e is a waiting job's entry as it is now (not
// stale: still waiting, at the same time).
func (sc *schedule) current(e dueEntry) bool {
	_, w, ok := sc.lookup(e.id)
	return ok && w.at == nanos(e.at)
}

// remove takes a job out of the schedule (its heap entry goes stale).
func (sc *schedule) remove(id string) (dueEntry, bool) {
	k, e, ok := sc.lookup(id)
	if !ok {
		return dueEntry{}, false
	}
	d := sc.fat(e)
	delete(sc.waiting, k)
	if ids := sc.byTenant[e.tenant]; ids != nil {
		delete(ids, k)
		if len(ids) == 0 {
			delete(sc.byTenant, e.tenant)
		}
	}
	sc.names.unref(e.tenant)
	if sc.peak >= shrinkFrom && len(sc.waiting) <= sc.peak/4 {
		sc.shrink()
	}
	return d, true
}

// shrinkFrom is the smallest peak the schedule shrinks from: below it, what
// a drained backlog leaves is not worth an O(jobs) rebuild.
const shrinkFrom = 4096

// shrink builds the schedule's maps and heaps anew at the size of what
// waits now, once a quarter of the peak is left: memory follows a backlog
// down. Each rebuild is O(jobs waiting), after at least three times as
// many removals since the peak.
func (sc *schedule) shrink() {
	waiting := make(map[jobKey]slimEntry, len(sc.waiting))
	for k, e := range sc.waiting {
		waiting[k] = e
	}
	sc.waiting = waiting
	byTenant := make(map[uint32]map[jobKey]struct{}, len(sc.byTenant))
	for n, ids := range sc.byTenant {
		fresh := make(map[jobKey]struct{}, len(ids))
		for k := range ids {
			fresh[k] = struct{}{}
		}
		byTenant[n] = fresh
	}
	sc.byTenant = byTenant
	sc.heap, sc.expiry = nil, nil
	sc.compact()
	sc.peak = len(sc.waiting)
}

// tenantSlots calls f with the slot of each of a tenant's waiting jobs
// in its depth (not those booked for their not_before).
func (sc *schedule) tenantSlots(tenant string, f func(slot time.Time)) {
	n, ok := sc.names.byName[tenant]
	if !ok {
		return
	}
	for k := range sc.byTenant[n] {
		if e := sc.waiting[k]; !e.scheduled {
			f(fromNanos(e.slot))
		}
	}
}

// tenantEntries calls f with each of a tenant's waiting jobs' entries.
func (sc *schedule) tenantEntries(tenant string, f func(e dueEntry)) {
	n, ok := sc.names.byName[tenant]
	if !ok {
		return
	}
	for k := range sc.byTenant[n] {
		f(sc.fat(sc.waiting[k]))
	}
}

// retime moves a tenant's waiting jobs to their real times under p: O(jobs
// waiting in memory), nothing written.
func (sc *schedule) retime(tenant string, p leaky.Pause) {
	n, ok := sc.names.byName[tenant]
	if !ok {
		return
	}
	for k := range sc.byTenant[n] {
		e := sc.waiting[k]
		if at := nanos(rules.RealAt(p, fromNanos(e.slot))); at != e.at {
			e.at = at
			sc.waiting[k] = e
			sc.heap.push(e)
		}
	}
	sc.maybeCompact()
}

// peek drops stale entries and returns the earliest waiting one.
func (sc *schedule) peek() (dueEntry, bool) {
	for len(sc.heap) > 0 {
		e := sc.heap[0]
		if w, ok := sc.waiting[e.id]; ok && w.at == e.at {
			return sc.fat(w), true
		}
		sc.heap.pop()
	}
	return dueEntry{}, false
}

// pop drops the earliest entry (the one peek returned).
func (sc *schedule) pop() { sc.heap.pop() }

// len is how many jobs wait in the schedule.
func (sc *schedule) len() int { return len(sc.waiting) }
