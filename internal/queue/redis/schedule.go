package redis

import (
	"container/heap"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// entry is one job in an owner's schedule: when to claim it (a lead
// before at) and whose it is. Only what scheduling needs: the job itself
// stays in Redis until its claim reads it.
type entry struct {
	at time.Time // its dispatch time, as last known
	// place is its place in its tenant's order: the dispatch time it was
	// first scheduled for. Entries due at one moment (a tenant's backlog
	// held to its pace, or woken by a resume) are claimed in that order,
	// so a tenant's jobs go in the order they were admitted.
	place  time.Time
	id     string
	tenant string
	held   bool // waiting out an operator's hold: a resume here wakes it
	// expiry: its claim comes at its deadline, which a pause moved its
	// dispatch time past: the claim expires it, it sends nothing, so the
	// tenant's pace does not hold it.
	expiry bool
	// paced: held back past due, its time before, for its tenant's pace
	// (owned.paced), which a reload may bring sooner (owned.repaceHeld).
	paced bool
	due   time.Time
	index int // in the heap
}

// schedule is an owner's waiting jobs, earliest first.
type schedule []*entry

func (q schedule) Len() int { return len(q) }
func (q schedule) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].place.Before(q[j].place)
}
func (q schedule) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *schedule) Push(x any) {
	e := x.(*entry)
	e.index = len(*q)
	*q = append(*q, e)
}
func (q *schedule) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

func (q *schedule) add(e *entry) { heap.Push(q, e) }

// popDue takes the entries due by (at or before it), at most n.
func (q *schedule) popDue(by time.Time, n int) []*entry {
	var due []*entry
	for q.Len() > 0 && len(due) < n && !(*q)[0].at.After(by) {
		due = append(due, heap.Pop(q).(*entry))
	}
	return due
}

// next is the earliest entry's time (false: none).
func (q schedule) next() (time.Time, bool) {
	if len(q) == 0 {
		return time.Time{}, false
	}
	return q[0].at, true
}

// wake makes the held entries of tenant due at now, or at their floor if
// later (see owned.floors): a job claimed before its floor would be
// "dispatching" (out of a hold's or a cancel's reach) until then. In
// their places' order, none before the one ahead of it: a job admitted
// after a takeover has no floor, and went before the floored jobs ahead
// of it.
func (q *schedule) wake(tenant string, now time.Time, floor func(id string) time.Time) {
	var held []*entry
	for _, e := range *q {
		if e.held && e.tenant == tenant {
			held = append(held, e)
		}
	}
	slices.SortStableFunc(held, func(a, b *entry) int { return a.place.Compare(b.place) })
	ahead := now
	for _, e := range held { // fixed after the scan: Fix reorders the heap
		// Not an expiry any more (a takeover's look at a held job's
		// deadline): it goes by its place, at its tenant's pace.
		e.at, e.held, e.expiry = clock.Later(ahead, floor(e.id)), false, false
		ahead = e.at
		heap.Fix(q, e.index)
	}
}

// expire makes the entries of the jobs in missed due at their deadlines
// (a lead after, so claimed at them): their claims expire them (see
// entry.expiry).
func (q *schedule) expire(missed map[string]time.Time, lead time.Duration) {
	var hit []*entry
	for _, e := range *q {
		if _, ok := missed[e.id]; ok && !e.held {
			hit = append(hit, e)
		}
	}
	for _, e := range hit { // fixed after the scan: Fix reorders the heap
		e.at, e.expiry, e.paced = missed[e.id].Add(lead), true, false
		heap.Fix(q, e.index)
	}
}

// repace moves each entry held back for its tenant's pace to the later of
// its own time and that pace (at, by the policy in force now).
func (q *schedule) repace(at func(tenant string) time.Time) {
	for _, e := range *q {
		if e.paced {
			e.at = clock.Later(at(e.tenant), e.due)
		}
	}
	heap.Init(q)
}
