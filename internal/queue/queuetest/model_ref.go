package queuetest

import (
	"slices"
	"time"
)

// The reference model: DESIGN.md sections 2-4 and the Store contract
// (queue.Store, queue.Outcome), written again from the text, apart from
// internal/leaky and the backends, so that two implementations check each
// other.
//
// Rules, in brief (T interval, B burst, C capacity, tau = (B-1)T, all
// schedule times in tenant time, which stands still while the tenant is
// paused):
//
//   - admission (GCRA with a queue): slot = max(now, tat - tau); a job of
//     cost c is admitted iff max(tat, now) + (c-1)T - tau - now <= C*T; then
//     tat = max(tat, now) + cT. Refused: Retry-After is the time until it
//     would be admitted. Cost above C+B (or a window's N): 422.
//   - room: besides the schedule, at most C+B jobs are waiting or going at
//     once (C while paused: nothing goes at once); this is what bounds the
//     queue when jobs wait to retry. With windows the bound is by count
//     alone (a window makes jobs wait, it never refuses them): a job that
//     cannot go at once is admitted iff fewer than C really wait (slot
//     after now), and the room stays C+B.
//   - windows: a send goes no sooner than every window of length L that
//     holds it holds at most N sends scheduled (each cost-c send counts c;
//     this is the earliest slot, the store may give a later one); the rest
//     of the schedule follows a moved job; a window new to a policy starts
//     empty, a dropped one keeps its sends until the tenant's record next
//     writes its windows.
//   - cancel: the last job of a leaky schedule without windows gives its
//     place back (in memory, until the tenant's record is next written).
//   - deadline: a job that would be sent after it is refused (422), and a
//     job not sent by it ends expired, never sent.
//   - outcomes: 2xx delivered; 4xx failed (Store.Retry takes it back like a
//     new job); 5xx and timeouts take a new slot at the schedule's next
//     place and no sooner than the backoff; 429 with Retry-After keeps the
//     job's slot and stops the tenant's clock from that slot until then.
//   - operator hold: the clock stands still until resume; jobs admitted
//     meanwhile go one interval apart after it.
//   - crash: whatever was committed stays; an attempt written and not
//     recorded may be sent again (same job id, so the same
//     Idempotency-Key), and after a restart the tenant's next send comes no
//     sooner than the writes so far allow (GCRA), and one interval after
//     the last recorded one. Where that leaves the store a choice (how far
//     beyond), the model takes the store's times and schedule and checks
//     the bound.
//   - the rate at the downstream: the writes of a tenant conform to GCRA
//     (T, tau) counting attempts (invariant 1: at most W/T + burst in any
//     window W) and, apart, counting cost; a write whose slot was given
//     under another policy (a reload since) is the dispatcher's gate's to
//     re-pace and is left out.
//
// What the model leaves to the store and only bounds: the exact slot a
// window gives (at or after the earliest one that fits), and the spacing a
// restart chooses.

type mstate int

const (
	msWaiting mstate = iota
	msInFlight
	msSucceeded
	msFailed
	msCancelled
	msExpired
)

func (s mstate) String() string {
	return [...]string{"waiting", "in flight", "succeeded", "failed", "cancelled", "expired"}[s]
}

// mpause is a tenant's clock: tenant time = real time minus the pauses so
// far, standing still while paused (DESIGN.md section 4).
type mpause struct {
	shift time.Duration // how far tenant time runs behind, once the pause is over
	until time.Time     // a timed pause (pushback) ends then
	held  time.Time     // an operator hold began then (zero: none)
}

func laterOf(a time.Time, bs ...time.Time) time.Time {
	for _, b := range bs {
		if b.After(a) {
			a = b
		}
	}
	return a
}

// mtag is the policy a slot was given under: the spacing and windows the
// send is checked against (a reload does not move jobs already waiting:
// they keep the spacing they were given; the dispatcher's gate re-paces
// live sends, this test checks the store's schedule).
type mtag struct {
	T, tau time.Duration
	wins   []*mwin
}

type mentry struct {
	at     time.Time // tenant time
	weight int
}

// mwin is one window of a tenant's policy: its scheduled sends.
type mwin struct {
	spec    WindowSpec
	entries []mentry
	// writes seen at the downstream of jobs scheduled under this window
	writes []mentry // real time
}

type mjob struct {
	n        int // admission order in the run
	id       string
	tn       *mtenant
	key      string
	cost     int
	deadline time.Time
	payload  string
	state    mstate
	slot     time.Time // tenant time of the next attempt
	attempts int       // attempts recorded
	tag      mtag
	writes   []time.Time
	// the attempt in flight
	writeAt  time.Time
	answer   Answer
	answerAt time.Time // a timeout's answer
	// possiblySent: a write whose outcome was never recorded (a crash came
	// between): sending it again is allowed, with the same id.
	possiblySent  bool
	pushedBack    bool // its last attempt was answered 429: the next is a resend
	heldResend    bool // possibly sent before a crash while its tenant was held (DefectHeldRestart)
	lateExpiry    bool // past its deadline, held: expired when the store gets to it (DefectLateExpiry)
	staleDispatch bool // overdue at a restart: the store's dispatch_at is its old slot's (DefectRestartOverdue)
	// what it was told at admission (or at Store.Retry)
	admittedAt time.Time
	promised   time.Duration
	// the first answer, told again for a repeat of its key
	promisedFirst time.Duration
	admitDepth    int
	// disturbed: a pause or a crash came between the promise and the
	// first attempt, so the promise no longer has to hold.
	disturbed bool
	// notBefore: it was booked for it (real time), past its place in the
	// queue; scheduled: until its first attempt, it counts in its
	// tenant's scheduled jobs, not in its depth.
	notBefore time.Time
	scheduled bool
}

type capChange struct {
	at time.Time
	c  int
}

type mtenant struct {
	name         string
	pol          PolicySpec
	maxT         time.Duration
	caps         []capChange
	tat          time.Time
	persistedTAT time.Time // as last written with the tenant's record
	pz           mpause
	lastRecorded time.Time // the last send whose outcome was recorded
	wins         []*mwin   // of the current policy
	// dormant: windows a reload dropped, with their sends: a reload that
	// puts one back finds them (the jobs sent or waiting under it count)
	dormant map[WindowSpec]*mwin
	jobs    []*mjob
	keys    map[string]*mjob
	// rate check: GCRA on the writes seen at the downstream, weighted by
	// cost and not
	rateTAT, rateTAT1 time.Time
	writes            []time.Time
	writeCosts        []int           // of each write
	writeSteps        []time.Duration // each write's cost in intervals, at the interval in force then (the gate's step)
	gateHeld          []time.Time     // writes later than their slot: held by the gate (mjob.latest)
	slowed            bool            // a reload has slowed the rate (DefectSlowReloadPromise)
	lastWriteT        time.Duration
	lastWriteCost     int
	// booked: retries whose backoff ends past their place in the
	// schedule, at their slots (queue.TenantRecord.Booked), soonest first
	booked, persistedBooked []mbooking
	// capped: a policy with max_in_flight has been in force: a write may
	// come later than its slot, waiting for a place (when is the store's;
	// the count of attempts open is checked, processCaps)
	capped bool
}

// persist notes the tenant's schedule as written with its record.
func (tn *mtenant) persist() {
	tn.persistedTAT, tn.persistedBooked = tn.tat, slices.Clone(tn.booked)
}

func (tn *mtenant) tau() time.Duration { return time.Duration(tn.pol.Burst-1) * tn.pol.Interval }

func (tn *mtenant) tagNow() mtag {
	return mtag{T: tn.pol.Interval, tau: tn.tau(), wins: slices.Clone(tn.wins)}
}

func (tn *mtenant) maxCost() int {
	n := tn.pol.Capacity + tn.pol.Burst
	for _, w := range tn.pol.Windows {
		n = min(n, w.N)
	}
	return n
}

func (tn *mtenant) waiting() []*mjob {
	var out []*mjob
	for _, j := range tn.jobs {
		if j.state == msWaiting {
			out = append(out, j)
		}
	}
	return out
}

func (tn *mtenant) count(s mstate) int {
	n := 0
	for _, j := range tn.jobs {
		if j.state == s {
			n++
		}
	}
	return n
}

// capacityBound is the most queued jobs admitted since since may hold: the
// largest capacity in force meanwhile.
func (tn *mtenant) capacityBound(since time.Time) int {
	c := 0
	for i, ch := range tn.caps {
		if i+1 < len(tn.caps) && tn.caps[i+1].at.Before(since) {
			continue
		}
		c = max(c, ch.c)
	}
	return c
}

type model struct {
	tenants map[string]*mtenant
	order   []string
	jobs    []*mjob
	byID    map[string]*mjob
	known   Defect
}

func newModel(known Defect) *model {
	m := &model{tenants: map[string]*mtenant{}, byID: map[string]*mjob{}, known: known}
	for _, name := range modelTenants {
		tn := &mtenant{name: name, keys: map[string]*mjob{}}
		m.tenants[name] = tn
		m.order = append(m.order, name)
		m.reload(tn, defaultModelPolicy, T0)
	}
	return m
}

func (m *model) reload(tn *mtenant, p PolicySpec, now time.Time) {
	tn.capped = tn.capped || p.MaxInFlight > 0
	// A faster rate allows the next send sooner: the writes so far are
	// spaced by the faster of the two.
	if n := len(tn.writes); n > 0 && p.Interval < tn.pol.Interval {
		last := tn.writes[n-1]
		tn.rateTAT = earliest(tn.rateTAT, last.Add(time.Duration(tn.lastWriteCost)*p.Interval))
		tn.rateTAT1 = earliest(tn.rateTAT1, last.Add(p.Interval))
	}
	if p.Interval > tn.pol.Interval || time.Duration(p.Burst-1)*p.Interval < tn.tau() {
		// Slower: the gate holds the jobs scheduled before back to the
		// new rate (latest); what they were told no longer binds.
		tn.disturb()
		tn.slowed = tn.slowed || p.Interval > tn.pol.Interval
	}
	tn.pol = p
	tn.maxT = max(tn.maxT, p.Interval)
	tn.caps = append(tn.caps, capChange{at: now, c: p.Capacity})
	// Windows are kept by what they say: one that stays keeps its sends, a
	// new one starts empty, a dropped one keeps its sends for a reload that
	// brings it back.
	if tn.dormant == nil {
		tn.dormant = map[WindowSpec]*mwin{}
	}
	for _, w := range tn.wins {
		tn.dormant[w.spec] = w
	}
	var wins []*mwin
	for _, ws := range p.Windows {
		found := tn.dormant[ws]
		if found == nil {
			found = &mwin{spec: ws}
		}
		delete(tn.dormant, ws)
		wins = append(wins, found)
	}
	tn.wins = wins
}

// Decision kinds.
const (
	mAdmitted = iota + 1
	mRejected
	mCostTooLarge
	mWouldExpire
	mScheduleFull // booked for its not_before: max_scheduled of them are
)

type mdecision struct {
	kind int
	slot time.Time // admitted: tenant time (with windows: the earliest the store may give)
	// delay: admitted or would_expire: real time until its slot (with
	// windows, at least this)
	delay time.Duration
	exact bool // delay and slot are exact (no window)
	// ra: rejected: Retry-After (raExact: exactly; else at least)
	ra      time.Duration
	raExact bool
	raWhy   string
	over    bool // more than capacity wait already
	maxCost int
	// scheduled: admitted, booked for its not_before at slot (exact)
	scheduled bool
}

// decide admits or refuses a job of cost with deadline (zero: none) for tn
// at now, without changing anything.
func (m *model) decide(tn *mtenant, now time.Time, cost int, deadline time.Time, inCall map[*mjob]bool) mdecision {
	return m.decideCost(tn, now, cost, deadline, inCall, true)
}

// decideCost is decide; !bound: a cost above the bucket is decided as any
// (see DefectRetryCost).
func (m *model) decideCost(tn *mtenant, now time.Time, cost int, deadline time.Time, inCall map[*mjob]bool, bound bool) mdecision {
	p := tn.pol
	T, C, B := p.Interval, p.Capacity, p.Burst
	tau := tn.tau()
	cost = max(cost, 1)
	if mc := tn.maxCost(); cost > mc && bound {
		return mdecision{kind: mCostTooLarge, maxCost: mc}
	}
	tt := tn.pz.tenantTime(now)
	tat, _ := tn.absorbed(tt, cost, m.known) // placed around the retries booked ahead
	paused := tn.pz.paused(now)
	told := func(s time.Time) time.Time { return tn.pz.told(s, now) }
	waiting := tn.queued() // those booked for their not_before take no room
	// dispatch times of the waiting jobs as people are told them, soonest
	// first: when each of them stops waiting. With windows the bound counts
	// only the jobs that really wait (not one that goes now).
	var leave []time.Time
	for _, j := range waiting {
		if len(tn.wins) > 0 && inCall[j] && m.known&DefectBatchWindow != 0 {
			continue // the store counts only jobs of earlier calls
		}
		if at := told(j.slot); len(tn.wins) == 0 || paused || at.After(now) {
			leave = append(leave, at)
		}
	}
	slices.SortFunc(leave, func(a, b time.Time) int { return a.Compare(b) })
	// untilFewer is when fewer than n wait.
	untilFewer := func(n int) time.Time {
		if len(leave) < n {
			return now
		}
		return leave[len(leave)-n]
	}
	var d mdecision
	if len(tn.wins) == 0 {
		base := laterOf(tat, tt)
		slot := laterOf(tt, tat.Add(-tau))
		excess := base.Add(time.Duration(cost-1) * T).Add(-tau).Sub(tt)
		room := C + B
		if paused {
			room = C // nothing goes at once: every job waits
		}
		// Admitted by count once the pause is over (room C+B again) and
		// fewer than C+B wait.
		countAt := laterOf(now, tn.pz.resume(now).until, untilFewer(C+B))
		if excess > time.Duration(C)*T {
			ra := told(tt.Add(excess - time.Duration(C)*T)).Sub(now)
			if len(waiting) >= room {
				// The count refuses it too (retries booked past their
				// places fill the room): not before both let it in, and
				// the job that leaves then moves the schedule on, which
				// the answer may count too.
				return mdecision{kind: mRejected, ra: max(ra, countAt.Sub(now)), raExact: false, raWhy: "schedule and count"}
			}
			return mdecision{kind: mRejected, ra: ra, raExact: true, raWhy: "schedule"}
		}
		if len(waiting) >= room {
			return mdecision{kind: mRejected, ra: countAt.Sub(now), raExact: true, raWhy: "count"}
		}
		d = mdecision{kind: mAdmitted, slot: slot, delay: told(slot).Sub(now), exact: true}
	} else {
		s0 := laterOf(tt, tat.Add(-tau))
		s := tn.earliestWindow(s0, cost)
		atOnce := !paused && s.Equal(tt)
		// The earliest time it could go at once: the schedule and every
		// window allow it then (tenant time, as if resumed).
		onceAt := tn.earliestWindow(laterOf(tt, tat.Add(time.Duration(cost-1)*T).Add(-tau)), cost)
		if C == 0 {
			if room := B; paused || len(waiting) >= room {
				return mdecision{kind: mRejected, ra: laterOf(now, tn.pz.resume(now).until, untilFewer(room)).Sub(now), raExact: false, raWhy: "count"}
			}
			excess := laterOf(tat, tt).Add(time.Duration(cost-1) * T).Add(-tau).Sub(tt)
			if excess > 0 || !atOnce {
				return mdecision{kind: mRejected, ra: told(onceAt).Sub(now), raExact: false, raWhy: "window"}
			}
		} else {
			if room := C + B; !paused && len(leave) >= room {
				// The same room as without windows: capacity waiting,
				// burst going at once.
				return mdecision{kind: mRejected, ra: laterOf(now, untilFewer(room)).Sub(now), raExact: false, raWhy: "count"}
			}
			if !atOnce && len(leave) >= C {
				at := untilFewer(C)
				if !paused {
					at = earliest(at, told(onceAt))
				}
				return mdecision{kind: mRejected, ra: laterOf(now, at).Sub(now), raExact: false, raWhy: "window count", over: len(leave) > C}
			}
		}
		d = mdecision{kind: mAdmitted, slot: s, delay: told(s).Sub(now)}
	}
	if !deadline.IsZero() && now.Add(d.delay).After(deadline) {
		return mdecision{kind: mWouldExpire, delay: d.delay, exact: d.exact}
	}
	return d
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// take applies an admitted decision (with the slot the store gave, for
// windows) to tn for job j.
func (m *model) take(tn *mtenant, j *mjob, now time.Time, slot time.Time) {
	if j.scheduled { // booked: the schedule's end stays
		tn.book(j, slot)
		if len(tn.wins) > 0 {
			tn.recordWindows(slot, j.cost)
		}
		j.slot, j.tag, j.state, j.attempts = slot, tn.tagNow(), msWaiting, 0
		j.admittedAt, j.promised, j.disturbed = now, tn.pz.told(slot, now).Sub(now), false
		j.possiblySent = false
		return
	}
	T := tn.pol.Interval
	tt := tn.pz.tenantTime(now)
	tn.tat, tn.booked = tn.absorbed(tt, j.cost, m.known)
	next := laterOf(tn.tat, tt).Add(time.Duration(j.cost) * T)
	if len(tn.wins) > 0 {
		next = laterOf(next, slot.Add(time.Duration(j.cost)*T)) // the rest follow a moved job
		tn.recordWindows(slot, j.cost)
	}
	tn.tat = next
	j.slot, j.tag, j.state, j.attempts = slot, tn.tagNow(), msWaiting, 0
	j.admittedAt, j.promised, j.disturbed = now, tn.pz.told(slot, now).Sub(now), false
	j.possiblySent = false
}

// reserve gives j (an attempt failed at now) its next slot: the schedule's
// next place from now, no sooner than notBefore. It returns the slot the
// model expects; with windows that is the earliest the store may give.
func (m *model) reserve(tn *mtenant, j *mjob, now, notBefore time.Time) (at time.Time, late bool) {
	T := tn.pol.Interval
	tnow := tn.pz.tenantTime(now)
	tnb := tn.pz.tenantTime(notBefore)
	tn.tat, tn.booked = tn.absorbed(tnow, j.cost, m.known)
	r := laterOf(tnow, tn.tat.Add(-tn.tau()))
	tn.tat = laterOf(tn.tat, tnow).Add(time.Duration(j.cost) * T)
	at = laterOf(r, tnb)
	if len(tn.wins) > 0 {
		at = tn.earliestWindow(at, j.cost)
	}
	if tnb.After(r) {
		at = tn.clearOfBookings(at, j.cost)
	}
	return at, tnb.After(r)
}

// placeReserved completes reserve once the slot is known (windows).
func (m *model) placeReserved(tn *mtenant, j *mjob, slot time.Time, backoffRuled bool) {
	if len(tn.wins) > 0 {
		tn.recordWindows(slot, j.cost)
		if !backoffRuled {
			tn.tat = laterOf(tn.tat, slot.Add(time.Duration(j.cost)*tn.pol.Interval))
		}
	}
	j.slot, j.tag = slot, tn.tagNow()
}

// expireIfLate ends j if its next attempt, as told now, would come after its
// deadline.
func (m *model) expireIfLate(j *mjob, now time.Time) {
	if j.state == msWaiting && !j.deadline.IsZero() && j.tn.pz.told(j.slot, now).After(j.deadline) {
		j.state = msExpired
	}
}

// disturb marks tn's waiting jobs: their promise no longer binds.
func (tn *mtenant) disturb() {
	for _, j := range tn.jobs {
		if j.state == msWaiting {
			j.disturbed = true
		}
	}
}

// mdue is what the store must have written of one tenant by a moment: at
// least n of jobs.
type mdue struct {
	jobs []*mjob
	n    int
}

// missing is how many more of d's jobs the store must write: written says
// which it has.
func (d mdue) missing(written map[string]bool) int {
	n := d.n
	for _, j := range d.jobs {
		if written[j.id] {
			n--
		}
	}
	return max(n, 0)
}

// due is what the store must have written by now, per tenant (in
// modelTenants order): as many of its waiting jobs as the dispatcher's gate
// lets go by then, each in turn (mjob.latest, moved on by the ones before
// it). Jobs due at one turn of the gate compete for it, and which goes
// first is the store's to choose: a tenant's jobs are not each required by
// their own latest (two of them due at the same turn, the second goes an
// interval later, and a wait for both would last until the settle's
// timeout).
func (m *model) due(now time.Time) []mdue {
	var out []mdue
	for _, name := range modelTenants {
		tn := m.tenants[name]
		if tn == nil || tn.capped {
			// A job of a capped tenant may wait for a place past its
			// time, as long as the attempts open (some a crash cut short,
			// which the model does not know) hold theirs: none is
			// required by its time, the drain requires them all.
			continue
		}
		type waiting struct {
			j   *mjob
			due time.Time
		}
		var ws []waiting
		for _, j := range tn.jobs {
			if j.state != msWaiting || j.lateExpiry {
				continue
			}
			if due, ok := tn.pz.real(j.slot); ok {
				ws = append(ws, waiting{j, due})
			}
		}
		if len(ws) == 0 {
			continue
		}
		slices.SortStableFunc(ws, func(a, b waiting) int { return a.due.Compare(b.due) })
		// The gate's schedule from the writes so far (as mjob.latest),
		// then moved on by each job it lets go by now.
		tat := tn.gateTAT()
		d := mdue{}
		for _, w := range ws {
			d.jobs = append(d.jobs, w.j)
			at := w.due
			if !tat.IsZero() {
				at = laterOf(at, tat.Add(-tn.tau()))
			}
			if at.After(now) {
				continue
			}
			d.n++
			tat = laterOf(tat, at).Add(time.Duration(w.j.cost) * tn.pol.Interval)
		}
		if d.n > 0 {
			out = append(out, d)
		}
	}
	return out
}

// next is the model's next event after now: a job due, a timeout's answer,
// a deadline (zero if none).
func (m *model) next(now time.Time) time.Time {
	var at time.Time
	consider := func(t time.Time) {
		if t.After(now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for _, j := range m.jobs {
		switch j.state {
		case msWaiting:
			if r, ok := j.tn.pz.real(j.slot); ok {
				consider(r)
			}
			if r, ok := j.latest(); ok {
				consider(r)
			}
			if !j.deadline.IsZero() {
				consider(j.deadline)
			}
		case msInFlight:
			consider(j.answerAt)
		}
	}
	return at
}

// expire ends the waiting jobs whose deadline has passed at now: they were
// not sent in time and never will be. With DefectLateExpiry a held
// tenant's job stays waiting until the store says it has expired it
// (lateExpiry).
func (m *model) expire(now time.Time) {
	for _, j := range m.jobs {
		if j.state == msWaiting && !j.deadline.IsZero() && j.deadline.Before(now) && !j.lateExpiry {
			// (A job found late stays the store's to expire, a resume
			// after its deadline included: checkAll takes its word.)
			if !j.tn.pz.held.IsZero() && m.known&DefectLateExpiry != 0 {
				j.lateExpiry = true
				continue
			}
			if due, ok := j.tn.pz.real(j.slot); ok && !due.After(j.deadline) {
				if j.tn.capped {
					// Due in time, held for a place past its deadline:
					// the store expires it when it next looks at it (on
					// Redis, when a place frees), never sends it.
					j.lateExpiry = true
					continue
				}
				if latest, _ := j.latest(); latest.After(j.deadline) {
					// Due in time, held by the gate past its deadline: the
					// store expires it when the gate would let it go.
					j.lateExpiry = true
					continue
				}
			}
			j.state = msExpired
		}
	}
}
