package bolt

import (
	"bytes"
	"cmp"
	"encoding/base32"
	"math"
	"slices"
	"time"

	"github.com/tidwall/btree"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// schedule is the dispatcher's in-memory view of the waiting jobs. It is
// changed only after the matching write commits, so it never shows a job
// that is not durable.
//
// Each tenant's jobs are a line in slot order (then id): a job's time is
// its slot under its tenant's pause, which keeps their order, so a line's
// first job is its earliest. The lines are in a heap by their first job's
// time: what is due comes from the top, and a tenant's lookups are a
// search of its line. A line is a B-tree of 48-byte entries without
// pointers, which the collector does not scan: about 100 bytes a job with
// its nodes' room (and 40 more for a job with a deadline, in the
// deadlines' heap); BenchmarkHeapPerWaitingJob measures the whole per
// waiting job.
type schedule struct {
	lines  map[string]*line
	byNum  []*line              // lines by number (expiry entries name their line so)
	free   []uint32             // numbers of lines gone
	order  []*line              // lines with a job not yet popped, by that job's time
	expiry minHeap[expiryEntry] // the waiting jobs with a deadline
	// withDeadline counts the waiting jobs with one: expiry's entries past
	// that are stale and rebuilt away.
	withDeadline int
	count        int
}

// line is a tenant's waiting jobs: those not popped (wait), and those pop
// took (held: a fair queue holds them, and they wait until removed). It is
// in the heap, at heapAt, while wait has a job.
type line struct {
	tenant string
	num    uint32
	wait   *btree.BTreeG[slimEntry]
	held   *btree.BTreeG[slimEntry]
	heapAt int
}

// lineDegree is a line's B-tree's: nodes of up to 63 entries (3 KB).
const lineDegree = 32

func newLine(tenant string) *line {
	opts := btree.Options{Degree: lineDegree, NoLocks: true} // s.mu guards it
	return &line{tenant: tenant, heapAt: -1,
		wait: btree.NewBTreeGOptions(slimEntry.before, opts), held: btree.NewBTreeGOptions(slimEntry.before, opts)}
}

func (l *line) len() int { return l.wait.Len() + l.held.Len() }

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

// slimEntry is how a line keeps a job: times in Unix nanoseconds
// (clock.Never and every slot within the horizon fit), 48 bytes.
type slimEntry struct {
	at, slot int64
	deadline int64 // noDeadline: none
	id       jobKey
	cost     int32
	flags    entryFlags
}

type entryFlags uint8

const (
	flagHeld      entryFlags = 1 << iota // dueEntry.held
	flagScheduled                        // dueEntry.scheduled
	flagNotBefore                        // dueEntry.notBefore
)

// expiryEntry is a job with a deadline, in the deadlines' heap: where to
// find it (its line by number, its slot) and when it expires.
type expiryEntry struct {
	deadline, slot int64
	id             jobKey
	line           uint32
}

func (x expiryEntry) earlier(o expiryEntry) bool {
	if x.deadline == o.deadline {
		return string(x.id[:]) < string(o.id[:])
	}
	return x.deadline < o.deadline
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

func (e slimEntry) is(f entryFlags) bool { return e.flags&f != 0 }

func fat(e slimEntry, tenant string) dueEntry {
	d := dueEntry{at: fromNanos(e.at), slot: fromNanos(e.slot), id: e.id.String(), tenant: tenant, cost: int(e.cost),
		held: e.is(flagHeld), scheduled: e.is(flagScheduled), notBefore: e.is(flagNotBefore)}
	if e.deadline != noDeadline {
		d.deadline = fromNanos(e.deadline)
	}
	return d
}

func slim(e dueEntry, k jobKey) slimEntry {
	se := slimEntry{at: nanos(e.at), slot: nanos(e.slot), deadline: noDeadline, id: k, cost: int32(min(e.cost, math.MaxInt32))}
	if !e.deadline.IsZero() {
		se.deadline = nanos(e.deadline)
	}
	if e.held {
		se.flags |= flagHeld
	}
	if e.scheduled {
		se.flags |= flagScheduled
	}
	if e.notBefore {
		se.flags |= flagNotBefore
	}
	return se
}

// before orders entries by slot, then id: a line's order.
func (e slimEntry) before(o slimEntry) bool {
	if e.slot != o.slot {
		return e.slot < o.slot
	}
	return string(e.id[:]) < string(o.id[:])
}

// linePlace orders entries as a line does.
func linePlace(a, b slimEntry) int {
	if a.slot != b.slot { // cmp.Or would compare the ids every time
		return cmp.Compare(a.slot, b.slot)
	}
	return bytes.Compare(a.id[:], b.id[:])
}

// earlier orders entries by time, then id (the order ids sort in): the
// order jobs are handed out in.
func (e slimEntry) earlier(o slimEntry) bool {
	if e.at == o.at {
		return string(e.id[:]) < string(o.id[:])
	}
	return e.at < o.at
}

// minHeap is a min-heap of what orders itself by earlier. Its own, not
// container/heap's: that boxes every entry pushed or popped in an
// interface, an allocation each.
type minHeap[T interface{ earlier(T) bool }] []T

func (h minHeap[T]) less(i, j int) bool { return h[i].earlier(h[j]) }

func (h *minHeap[T]) push(e T) {
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
func (h *minHeap[T]) pop() T {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	q.down(0)
	*h = q
	return top
}

func (h minHeap[T]) down(i int) {
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
func (h minHeap[T]) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// find finds job k in the line: at its place by slot if the slot is
// right, else looked for (a slot the caller read may be older than the
// schedule's). It returns the tree that has it, nil if neither does.
func (l *line) find(slot int64, k jobKey) (*btree.BTreeG[slimEntry], slimEntry) {
	if t, e := l.at(slot, k); t != nil {
		return t, e
	}
	for _, t := range []*btree.BTreeG[slimEntry]{l.wait, l.held} {
		var found slimEntry
		t.Scan(func(e slimEntry) bool {
			if e.id == k {
				found = e
				return false
			}
			return true
		})
		if found.id == k {
			return t, found
		}
	}
	return nil, slimEntry{}
}

// at finds job k at slot in the line, in O(log n); nil if not there.
func (l *line) at(slot int64, k jobKey) (*btree.BTreeG[slimEntry], slimEntry) {
	key := slimEntry{slot: slot, id: k}
	for _, t := range []*btree.BTreeG[slimEntry]{l.wait, l.held} {
		if e, ok := t.Get(key); ok {
			return t, e
		}
	}
	return nil, slimEntry{}
}

// lineOf is a tenant's line, made if it has none and make is set.
func (sc *schedule) lineOf(tenant string, make bool) *line {
	l := sc.lines[tenant]
	if l != nil || !make {
		return l
	}
	if sc.lines == nil {
		sc.lines = map[string]*line{}
	}
	l = newLine(tenant)
	if k := len(sc.free); k > 0 {
		l.num, sc.free = sc.free[k-1], sc.free[:k-1]
		sc.byNum[l.num] = l
	} else {
		l.num = uint32(len(sc.byNum))
		sc.byNum = append(sc.byNum, l)
	}
	sc.lines[tenant] = l
	return l
}

// settle puts line l where it belongs in the heap, or out of it, and
// forgets it once it is empty.
func (sc *schedule) settle(l *line) {
	switch {
	case l.wait.Len() > 0 && l.heapAt < 0:
		l.heapAt = len(sc.order)
		sc.order = append(sc.order, l)
		sc.up(l.heapAt)
	case l.wait.Len() > 0:
		sc.fix(l.heapAt)
	case l.heapAt >= 0:
		sc.unorder(l.heapAt)
	}
	if l.len() == 0 {
		delete(sc.lines, l.tenant)
		sc.byNum[l.num] = nil
		sc.free = append(sc.free, l.num)
	}
}

func (sc *schedule) add(e dueEntry) {
	k, ok := keyOf(e.id)
	if !ok {
		panic("bolt: schedule.add of an id not made by queue.NewID: " + e.id) // recover refuses such files
	}
	l := sc.lineOf(e.tenant, true)
	sc.put(l, slim(e, k))
	sc.settle(l)
}

// put adds an entry to a line (not popped), in place of one it may have.
func (sc *schedule) put(l *line, se slimEntry) {
	if old, had := l.held.Delete(se); had {
		sc.forget(old)
	}
	// Load appends without a search when the job goes last, as most do.
	if old, had := l.wait.Load(se); had {
		sc.forget(old) // replaced: counted once
	}
	sc.count++
	if se.deadline != noDeadline {
		sc.withDeadline++
		sc.expiry.push(expiryEntry{deadline: se.deadline, slot: se.slot, id: se.id, line: l.num})
		if len(sc.expiry) > 2*sc.withDeadline+1024 {
			sc.rebuildExpiry()
		}
	}
}

// fill gives a tenant with no line its jobs (a restart's), in any order:
// a restart keeps bookings where they are and places the rest around them.
// In order, each goes last (put).
func (sc *schedule) fill(tenant string, jobs []slimEntry) {
	if len(jobs) == 0 {
		return
	}
	if !slices.IsSortedFunc(jobs, linePlace) {
		slices.SortFunc(jobs, linePlace)
	}
	l := sc.lineOf(tenant, true)
	for _, e := range jobs {
		sc.put(l, e)
	}
	sc.settle(l)
}

// forget uncounts a job leaving the schedule.
func (sc *schedule) forget(e slimEntry) {
	sc.count--
	if e.deadline != noDeadline {
		sc.withDeadline--
	}
}

// rebuildExpiry makes the deadlines' heap anew from the jobs waiting:
// those removed leave their entries, skipped once they reach the top,
// which a busy schedule may take long to do.
func (sc *schedule) rebuildExpiry() {
	x := make(minHeap[expiryEntry], 0, sc.withDeadline+sc.withDeadline/4)
	for _, l := range sc.lines {
		for _, t := range []*btree.BTreeG[slimEntry]{l.wait, l.held} {
			t.Scan(func(e slimEntry) bool {
				if e.deadline != noDeadline {
					x = append(x, expiryEntry{deadline: e.deadline, slot: e.slot, id: e.id, line: l.num})
				}
				return true
			})
		}
	}
	x.init()
	sc.expiry = x
}

// The lines' heap, by their first job not popped.

func (sc *schedule) less(i, j int) bool { return sc.order[i].head().earlier(sc.order[j].head()) }

// head is the line's first job not popped (the line must be in the heap).
func (l *line) head() slimEntry {
	e, _ := l.wait.Min()
	return e
}

func (sc *schedule) swap(i, j int) {
	sc.order[i], sc.order[j] = sc.order[j], sc.order[i]
	sc.order[i].heapAt, sc.order[j].heapAt = i, j
}

func (sc *schedule) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !sc.less(i, parent) {
			return
		}
		sc.swap(i, parent)
		i = parent
	}
}

func (sc *schedule) down(i int) {
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(sc.order) && sc.less(l, least) {
			least = l
		}
		if r < len(sc.order) && sc.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		sc.swap(i, least)
		i = least
	}
}

func (sc *schedule) fix(i int) {
	sc.up(i)
	sc.down(i)
}

func (sc *schedule) unorder(i int) {
	n := len(sc.order) - 1
	l := sc.order[i]
	sc.swap(i, n)
	sc.order[n] = nil
	sc.order = sc.order[:n]
	if i < n {
		sc.fix(i)
	}
	l.heapAt = -1
	if cap(sc.order) > 4*len(sc.order)+64 {
		sc.order = slices.Clone(sc.order)
	}
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
	for len(sc.expiry) > 0 && sc.expiry[0].deadline <= n {
		x := sc.expiry.pop()
		if l, t, e := sc.locate(x); t != nil && e.at > e.deadline {
			out = append(out, fat(e, l.tenant))
			sc.removeFrom(l, t, e)
		}
	}
	return out
}

// locate finds the job of an expiry entry (a nil tree if it no longer
// waits at that slot). Only there: a job given another slot is removed
// and added again, with an expiry entry of its own, and the entries left
// by jobs that went are many (each is looked at once, at its deadline).
func (sc *schedule) locate(x expiryEntry) (*line, *btree.BTreeG[slimEntry], slimEntry) {
	if int(x.line) >= len(sc.byNum) || sc.byNum[x.line] == nil {
		return nil, nil, slimEntry{}
	}
	l := sc.byNum[x.line]
	t, e := l.at(x.slot, x.id)
	return l, t, e
}

// nextExpiry is the earliest deadline of a waiting job (zero if none).
func (sc *schedule) nextExpiry() time.Time {
	for len(sc.expiry) > 0 {
		if _, t, _ := sc.locate(sc.expiry[0]); t != nil {
			return fromNanos(sc.expiry[0].deadline)
		}
		sc.expiry.pop()
	}
	return time.Time{}
}

// lookup finds a tenant's waiting job by id; slot is where to look first
// (its record's: the job is found wherever it is). A nil tree: it does
// not wait.
func (sc *schedule) lookup(tenant string, slot time.Time, id string) (*line, *btree.BTreeG[slimEntry], slimEntry) {
	k, ok := keyOf(id)
	l := sc.lines[tenant]
	if !ok || l == nil {
		return nil, nil, slimEntry{}
	}
	t, e := l.find(nanos(slot), k)
	return l, t, e
}

// get returns a waiting job's entry.
func (sc *schedule) get(tenant string, slot time.Time, id string) (dueEntry, bool) {
	_, t, e := sc.lookup(tenant, slot, id)
	if t == nil {
		return dueEntry{}, false
	}
	return fat(e, tenant), true
}

// current reports whether e is a waiting job's entry as it is now (not
// stale: still waiting, at the same time).
func (sc *schedule) current(e dueEntry) bool {
	_, t, w := sc.lookup(e.tenant, e.slot, e.id)
	return t != nil && w.at == nanos(e.at)
}

// remove takes a tenant's job out of the schedule (slot: see lookup).
func (sc *schedule) remove(tenant string, slot time.Time, id string) (dueEntry, bool) {
	l, t, e := sc.lookup(tenant, slot, id)
	if t == nil {
		return dueEntry{}, false
	}
	sc.removeFrom(l, t, e)
	return fat(e, tenant), true
}

func (sc *schedule) removeFrom(l *line, t *btree.BTreeG[slimEntry], e slimEntry) {
	t.Delete(e)
	sc.forget(e)
	sc.settle(l)
}

// tenantSlots calls f with the slot of each of a tenant's waiting jobs
// in its depth (not those booked for their not_before).
func (sc *schedule) tenantSlots(tenant string, f func(slot time.Time)) {
	sc.tenantEntries(tenant, func(e dueEntry) {
		if !e.scheduled {
			f(e.slot)
		}
	})
}

// tenantEntries calls f with each of a tenant's waiting jobs' entries.
func (sc *schedule) tenantEntries(tenant string, f func(e dueEntry)) {
	if l := sc.lines[tenant]; l != nil {
		for _, t := range []*btree.BTreeG[slimEntry]{l.wait, l.held} {
			t.Scan(func(e slimEntry) bool {
				f(fat(e, tenant))
				return true
			})
		}
	}
}

// retime moves a tenant's waiting jobs to their real times under p: O(jobs
// of the tenant), nothing written (a time is not in a line's order). A
// popped job whose time moves is handed out again: its fair queue's entry
// is stale.
func (sc *schedule) retime(tenant string, p leaky.Pause) {
	l := sc.lines[tenant]
	if l == nil {
		return
	}
	atOf := func(e slimEntry) int64 { return nanos(rules.RealAt(p, fromNanos(e.slot))) }
	l.wait.WalkMut(func(items []slimEntry) bool {
		for i := range items {
			items[i].at = atOf(items[i])
		}
		return true
	})
	var moved []slimEntry
	l.held.Scan(func(e slimEntry) bool {
		if at := atOf(e); at != e.at {
			e.at = at
			moved = append(moved, e)
		}
		return true
	})
	for _, e := range moved {
		l.held.Delete(e)
		l.wait.Set(e)
	}
	sc.settle(l)
}

// peek returns the earliest waiting job not popped.
func (sc *schedule) peek() (dueEntry, bool) {
	if len(sc.order) == 0 {
		return dueEntry{}, false
	}
	l := sc.order[0]
	return fat(l.head(), l.tenant), true
}

// pop takes the earliest job not popped (the one peek returned) out of the
// order it is handed out in; it still waits until removed.
func (sc *schedule) pop() {
	l := sc.order[0]
	e, _ := l.wait.PopMin()
	l.held.Load(e)
	sc.settle(l)
}

// len is how many jobs wait in the schedule.
func (sc *schedule) len() int { return sc.count }
