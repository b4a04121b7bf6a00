package bolt

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/rules"
)

// fairQueue shares one downstream's ceiling between its tenants. Jobs due
// for it wait here and are handed over one per ceiling slot, tenants taking
// turns (round robin): a tenant with a deep backlog cannot starve one that
// sends a little, which waits at most one turn of the tenants due at the
// same time. Jobs here are still waiting (in schedule.waiting): a cancel or
// a pause makes their entry here stale, and stale entries are skipped.
type fairQueue struct {
	policy  leaky.Policy
	lane    rules.Lane // the ceiling's bucket, in real time
	version int        // counts changes to lane.Recent and pausedUntil
	saved   int        // the version on disk
	// pausedUntil: the downstream answered 429 (or 503) with Retry-After
	// under this ceiling: no send of any tenant before then.
	pausedUntil time.Time
	ring        []string // tenants with entries, in turn order
	turn        int      // index in ring of the tenant served next
	jobs        map[string][]dueEntry
}

func newFairQueue(p leaky.Policy) *fairQueue {
	return &fairQueue{policy: p, jobs: map[string][]dueEntry{}}
}

// push adds a due job. A tenant with nothing here yet goes next: it has
// not had a turn lately, and so a tenant that sends a little waits at most
// one slot of the ceiling beyond those already handed over.
func (q *fairQueue) push(e dueEntry) {
	if _, ok := q.jobs[e.tenant]; !ok {
		if len(q.ring) > 0 {
			q.turn %= len(q.ring)
		}
		q.ring = slices.Insert(q.ring, q.turn, e.tenant)
	}
	q.jobs[e.tenant] = append(q.jobs[e.tenant], e)
}

// lookahead is how far ahead of its slot a job is handed over for the
// ceiling: every slot handed over is one a newly due tenant must wait
// behind, so less than the store's lead, yet enough to be ready.
func (q *fairQueue) lookahead(lead time.Duration) time.Duration {
	if !q.paces() {
		return lead // caps alone: nobody waits behind a slot handed over
	}
	return min(lead, max(2*claimEvery, q.policy.Interval/2))
}

// paces reports whether the downstream has a ceiling: a queue made for
// caps on attempts in flight alone hands each job over at its own time.
func (q *fairQueue) paces() bool { return q.policy.Interval > 0 || len(q.policy.Windows) > 0 }

// next returns the entry whose turn it is, skipping stale ones (valid says
// which are not), without taking it.
func (q *fairQueue) next(valid func(dueEntry) bool) (dueEntry, bool) {
	for len(q.ring) > 0 {
		q.turn %= len(q.ring)
		tenant := q.ring[q.turn]
		list := q.jobs[tenant]
		for len(list) > 0 && !valid(list[0]) {
			list = list[1:]
		}
		if len(list) > 0 {
			q.jobs[tenant] = list
			return list[0], true
		}
		delete(q.jobs, tenant)
		q.ring = append(q.ring[:q.turn], q.ring[q.turn+1:]...)
	}
	return dueEntry{}, false
}

// take removes the entry next returned and passes the turn on.
func (q *fairQueue) take() {
	tenant := q.ring[q.turn]
	q.jobs[tenant] = q.jobs[tenant][1:]
	q.turn++
}

// ceilingSlot is the earliest the ceiling's rate lets any send go (a pause
// of the ceiling raised its TAT).
func (q *fairQueue) ceilingSlot(now time.Time) time.Time {
	if !q.paces() {
		return now
	}
	return q.lane.Earliest(q.policy, now)
}

// pass passes the turn on without taking anything.
func (q *fairQueue) pass() { q.turn++ }

// slot is the earliest the ceiling (its rate and its windows) lets e go,
// at or after now and e's own time.
func (q *fairQueue) slot(now time.Time, e dueEntry) time.Time {
	if !q.paces() {
		return e.at
	}
	return q.lane.Slot(q.policy, now, e.at, e.cost)
}

// use takes the ceiling's slot at for a send of cost.
func (q *fairQueue) use(at time.Time, cost int) {
	if q.paces() && q.lane.Use(q.policy, at, cost) {
		q.version++
	}
}

// unuse gives back the window places of a send at at that did not happen.
func (q *fairQueue) unuse(at time.Time, cost int) {
	if q.lane.Unuse(at, cost) {
		q.version++
	}
}

// idle reports whether the queue can be forgotten: nothing waits and it
// would decide the same afresh (windows need their history kept).
func (q *fairQueue) idle(now time.Time) bool {
	return len(q.ring) == 0 && !q.lane.TAT.After(now) && len(q.policy.Windows) == 0 && q.saved == q.version
}

// waitingTenants is how many tenants share the ceiling right now.
func (q *fairQueue) waitingTenants() int { return len(q.ring) }
