package api

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// The RateLimit fields of enqueue answers (draft-ietf-httpapi-ratelimit-
// headers): RateLimit-Policy says what a tenant's limits are, RateLimit how
// much of each is left after the answer, so that a client paces itself
// instead of being refused. docs/api.md ("RateLimit fields") says what quota,
// window and remaining mean for each kind of bucket; in short:
//
//   - the bucket (named after its mode, "leaky" or "token"): q places (leaky:
//     capacity waiting + burst at once; token: burst tokens), w the seconds
//     in which all q free again (a place frees every interval), r places a
//     job sent now would still find, t seconds until one more frees;
//   - each window (named as written, "1000/d"): q = N, w = its length, r the
//     sends left in it, t seconds until the oldest counted send leaves it.
//
// What the store's answers do not say (how many tokens a bursting bucket has
// left while its jobs go at once, what a window has counted) the API works
// out from the admissions it has answered itself: see memo.

// quota is one item of both fields.
type quota struct {
	name string
	q, w int64 // RateLimit-Policy: quota, window in seconds
	r, t int64 // RateLimit: remaining, seconds until more is available
}

// appendFields appends items to b formatted as `"name";a=1;b=2, ...` (the
// name quoted as %q quotes it): RateLimit-Policy with q and w, RateLimit
// with r and t.
func appendFields(b []byte, items []quota, a, bname string, values func(quota) (int64, int64)) []byte {
	for i, it := range items {
		if i > 0 {
			b = append(b, ", "...)
		}
		x, y := values(it)
		b = strconv.AppendQuote(b, it.name)
		b = strconv.AppendInt(append(b, a...), x, 10)
		b = strconv.AppendInt(append(b, bname...), y, 10)
	}
	return b
}

func policyValues(it quota) (int64, int64) { return it.q, it.w }
func stateValues(it quota) (int64, int64)  { return it.r, it.t }

// ceilSeconds is d in whole seconds, rounded up (the fields' unit; like
// Retry-After, a client that waits t is never early).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ceilDiv is how many intervals d spans, rounded up.
func ceilDiv(d, interval time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + interval - 1) / interval)
}

// appendPolicyItems appends a tenant's limits with nothing taken yet.
func appendPolicyItems(items []quota, p leaky.Policy, mode string) []quota {
	places := int64(p.Capacity + p.Burst)
	items = append(items, quota{name: mode, q: places, w: max(1, ceilSeconds(time.Duration(places)*p.Interval)), r: places})
	for _, w := range p.Windows {
		items = append(items, quota{name: w.String(), q: int64(w.N), w: max(1, ceilSeconds(w.Length)), r: int64(w.N)})
	}
	return items
}

// memo is what this process has seen of one tenant's bucket, for what the
// store's answers leave out: when the bucket's schedule ends (a job that
// goes at once says only that a place was free, not how many were) and the
// sends its windows count. It is kept only for tenants that can burst or
// have windows, and dropped once it no longer matters (the schedule has
// ended and every send has left the longest window), as the stores drop
// idle state. Another process's admissions are not in it: with several API
// processes on one Redis, each reports what it has admitted (docs/api.md).
type memo struct {
	tat   time.Time  // real time at which every place is free again
	sends []sendMark // the sends still in a window (or to come), by time
	until time.Time  // when the memo stops mattering
}

// sendMark is a send the windows count: its time and its cost.
type sendMark struct {
	at   time.Time
	cost int
}

// memos are the memos of all tenants (safe for concurrent use).
type memos struct {
	mu      sync.Mutex
	byName  map[string]*memo
	sweepAt int
	// lag is the store's start lag as the last job sent at once showed it
	// (its due time less its enqueue time): a job the store decides at now
	// arrives in its schedule at now + lag, and the fields count from there
	// when the store does not say what its decisions were made as of
	// (Admission.AsOf). That says it of the tenant's own next call: the
	// lag of another tenant's prompt job may be longer than the next
	// call's, and room counted from it would be refused (a busy CI run of
	// TestPacesItselfWithoutRate: told r=3, two got in).
	lag time.Duration
}

// sweepEvery is the fewest memos between two sweeps of idle ones: a sweep is
// O(memos), so sweeping only when their number doubles keeps it O(1) per
// answer.
const sweepEvery = 1024

// tally is the state of a tenant's limits after the decisions of one
// request (out, in order).
type tally struct {
	at    time.Time        // when a job sent now arrives in the schedule
	last  *queue.Admission // the last decision made now (not a repeat, not a 422)
	depth int              // the queue's depth after it
	tat   time.Time        // the schedule's end after it
	sends []sendMark       // the sends the windows may count, by time
}

// rateLimit works out the RateLimit fields of an answer to decisions out for
// tenant (ts its settings): RateLimit-Policy and RateLimit.
func (s *server) rateLimit(ctx context.Context, tenant string, ts config.TenantSettings, out []queue.Admission) (policy, state string) {
	p := ts.Policy()
	decided := s.clock.Now()
	tl := s.memos.observe(tenant, p, out, decided)
	now := tl.at
	if tl.last == nil {
		// Only repeats (or refusals for good): no decision says where the
		// queue stands now, the tenant's status does.
		if st, err := s.store.Tenant(ctx, tenant); err == nil {
			tl.depth = st.QueueDepth
			if st.ExpectedDelay > 0 && len(p.Windows) == 0 {
				// The next job's slot is tat - tau: tat follows.
				tl.tat = clock.Later(tl.tat, decided.Add(st.ExpectedDelay+p.Tolerance()))
			}
		}
	}
	var room [4]quota // the bucket and up to three windows without allocating
	items := appendPolicyItems(room[:0], p, ts.Mode)
	bucketState(&items[0], p, tl, now)
	for i, w := range p.Windows {
		windowState(&items[i+1], w, tl.sends, now)
	}
	if tl.last != nil && tl.last.Rejected != nil {
		refused(items, retryAfterSeconds(tl.last.Rejected.RetryAfter))
	}
	// Both fields in one string: one allocation for the two.
	var raw [256]byte
	b := appendFields(raw[:0], items, ";q=", ";w=", policyValues)
	mid := len(b)
	both := string(appendFields(b, items, ";r=", ";t=", stateValues))
	return both[:mid], both[mid:]
}

// refused marks what the last job was refused for: a full window if the
// bucket had room, else the bucket; either way its t is the Retry-After.
func refused(items []quota, retryAfter int64) {
	at := 0
	if items[0].r > 0 {
		for i := 1; i < len(items); i++ {
			if items[i].r == 0 {
				at = i
				break
			}
		}
	}
	items[at].r = 0
	items[at].t = max(items[at].t, retryAfter)
}

// bucketState fills the bucket's r and t. Places are taken two ways, and
// the store refuses a job when either is full: by the schedule (tat - now
// is how many intervals of jobs are ahead) and by count (depth: jobs
// admitted and not yet handed to the dispatcher). A leaky tenant with
// windows is bounded by the count of jobs that wait alone (a window holds
// its jobs back without refusing them, so its schedule runs far ahead of
// its places): those due after now, handed over or not.
func bucketState(it *quota, p leaky.Policy, tl tally, now time.Time) {
	places := int64(p.Capacity + p.Burst)
	byCount := max(0, places-int64(tl.depth))
	ahead := max(0, tl.tat.Sub(now))
	bySchedule := max(0, places-ceilDiv(ahead, p.Interval))
	windowed := len(p.Windows) > 0 && p.Capacity > 0
	it.r = min(byCount, bySchedule)
	if windowed {
		it.r = min(byCount, max(0, int64(p.Capacity)-int64(waitingAfter(tl.sends, now))))
	}
	switch {
	case it.r >= places:
		it.t = 0 // nothing is taken: nothing more to come
	case windowed:
		it.t = max(1, ceilSeconds(nextDue(tl.sends, now).Sub(now)))
	default:
		// The schedule frees a place each interval: the next one when
		// ahead drops to a whole number of intervals fewer.
		k := ceilDiv(ahead, p.Interval)
		it.t = max(1, ceilSeconds(ahead-time.Duration(k-1)*p.Interval))
	}
}

// waitingAfter is how many of the sends are due after now.
func waitingAfter(sends []sendMark, now time.Time) int {
	i, _ := slices.BinarySearchFunc(sends, now, func(m sendMark, t time.Time) int {
		if m.at.After(t) {
			return 1
		}
		return -1
	})
	return len(sends) - i
}

// nextDue is the first send after now: when a waiting job leaves the queue
// (now + 1 s if none is known).
func nextDue(sends []sendMark, now time.Time) time.Time {
	i := len(sends) - waitingAfter(sends, now)
	if i == len(sends) {
		return now.Add(time.Second)
	}
	return sends[i].at
}

// windowState fills a window's r and t from the sends it counts: as the
// store's bookkeeping does, the newest N of those that have not left it
// (a window has room for a job when its oldest counted send has left).
func windowState(it *quota, w leaky.Window, sends []sendMark, now time.Time) {
	counted := 0
	var oldest time.Time
	for i := len(sends) - 1; i >= 0 && counted < w.N && sends[i].at.After(now.Add(-w.Length)); i-- {
		counted += sends[i].cost
		oldest = sends[i].at
	}
	it.r = max(0, int64(w.N-counted))
	if counted > 0 {
		it.t = ceilSeconds(oldest.Add(w.Length).Sub(now))
	}
}

// observe folds the decisions of one request into the tenant's memo and
// returns the state after them.
func (ms *memos) observe(tenant string, p leaky.Policy, out []queue.Admission, now time.Time) tally {
	keep := p.Burst > 1 || len(p.Windows) > 0
	var longest time.Duration // the longest window: sends older than it count nowhere
	for _, w := range p.Windows {
		longest = max(longest, w.Length)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.byName[tenant]
	if m == nil {
		m = &memo{}
	}
	tl := tally{tat: m.tat, sends: m.sends}
	var asOf time.Time // the latest moment the store decided these as of
	for i := range out {
		a := &out[i]
		asOf = clock.Later(asOf, a.AsOf)
		switch {
		case a.Impossible != nil, a.Duplicate:
			continue
		case a.Rejected != nil:
			tl.last, tl.depth = a, a.QueueDepth
			continue
		}
		tl.last, tl.depth = a, a.QueueDepth
		cost := a.Job.EffectiveCost()
		span := time.Duration(cost) * p.Interval
		due := a.Job.DispatchAt
		if a.Job.Prompt {
			ms.lag = max(0, due.Sub(a.Job.EnqueuedAt))
			// It went at once: the schedule was at most tau ahead; this
			// process's memo says how far.
			tl.tat = clock.Later(tl.tat, due).Add(span)
		} else {
			// It waits: its slot is the schedule's end less tau.
			tl.tat = clock.Later(tl.tat, due.Add(p.Tolerance()+span))
		}
		if longest > 0 {
			tl.sends = addSend(tl.sends, sendMark{at: due, cost: cost})
		}
	}
	if asOf.IsZero() {
		now = now.Add(ms.lag)
	} else {
		now = asOf
	}
	tl.at = now
	// Sends that have left the longest window count nowhere.
	first := 0
	for first < len(tl.sends) && !tl.sends[first].at.After(now.Add(-longest)) {
		first++
	}
	tl.sends = tl.sends[first:]
	if !keep {
		return tl
	}
	m.tat, m.sends = tl.tat, tl.sends
	m.until = m.tat
	if n := len(m.sends); n > 0 {
		m.until = clock.Later(m.until, m.sends[n-1].at.Add(longest))
	}
	ms.put(tenant, m, now)
	return tl
}

// addSend returns sends with m in its place by time. Tallies of other
// requests may still read sends outside the lock: appending writes only
// past their ends, and a send that goes anywhere else goes in a copy.
func addSend(sends []sendMark, m sendMark) []sendMark {
	n := len(sends)
	if n == 0 || !m.at.Before(sends[n-1].at) {
		return append(sends, m)
	}
	i, _ := slices.BinarySearchFunc(sends, m.at, func(a sendMark, t time.Time) int { return a.at.Compare(t) })
	return slices.Insert(slices.Clip(sends), i, m)
}

// put keeps m for tenant (ms.mu held), sweeping idle memos now and then.
func (ms *memos) put(tenant string, m *memo, now time.Time) {
	if ms.byName == nil {
		ms.byName = map[string]*memo{}
	}
	ms.byName[tenant] = m
	if len(ms.byName) < max(ms.sweepAt, sweepEvery) {
		return
	}
	for name, x := range ms.byName {
		if !x.until.After(now) {
			delete(ms.byName, name)
		}
	}
	ms.sweepAt = 2 * len(ms.byName)
}

// setRateLimit puts the RateLimit fields of the decisions out on w.
func (s *server) setRateLimit(w http.ResponseWriter, r *http.Request, tenant string, ts config.TenantSettings, out []queue.Admission) {
	policy, state := s.rateLimit(r.Context(), tenant, ts, out)
	// The keys as Header.Set would canonicalise them, and one slice for
	// both values: this is on every enqueue's path.
	values := []string{policy, state}
	h := w.Header()
	h["Ratelimit-Policy"] = values[0:1:1]
	h["Ratelimit"] = values[1:2:2]
}
