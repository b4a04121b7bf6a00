// Package simulate replays arrival times through the classic rate-limiting
// algorithms side by side, under one limit: fixed window, sliding window
// (log, and the two-counter approximation), token bucket and leaky bucket
// (as a queue). The token and leaky lanes run internal/leaky, the very code
// the service decides with, so a simulation with a tenant's config predicts
// what the service does with the same arrivals.
package simulate

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// Limit is the one limit every algorithm gets.
type Limit struct {
	// Interval is T = 1/rate.
	Interval time.Duration
	// Burst: the window algorithms allow Burst per Burst*Interval (10 per
	// 10 s for 1/s with burst 10); the token bucket holds Burst.
	Burst int
	// Token and Leaky are the policies of the two GCRA lanes. From a
	// tenant's config, the lane of its mode is its exact policy.
	Token, Leaky leaky.Policy
	// Service names the lane that is the tenant's own policy ("" if none).
	Service string
}

// NewLimit is the limit of rate, burst and capacity: token bucket of burst,
// leaky bucket of capacity (burst 1, the plain queue).
func NewLimit(interval time.Duration, burst, capacity int) Limit {
	return Limit{
		Interval: interval,
		Burst:    burst,
		Token:    leaky.Policy{Interval: interval, Burst: burst},
		Leaky:    leaky.Policy{Interval: interval, Burst: 1, Capacity: capacity},
	}
}

// Window is the length the window algorithms count over: Burst intervals.
func (l Limit) Window() time.Duration { return time.Duration(l.Burst) * l.Interval }

// Algorithm decides arrivals offered in time order.
type Algorithm interface {
	Name() string
	// Offer decides an arrival at (time since the start): accepted (sent
	// at send) or refused (come back after retryAfter).
	Offer(at time.Duration) (accepted bool, send, retryAfter time.Duration)
}

// Algorithms returns fresh lanes for l, in the order they are shown.
func Algorithms(l Limit) []Algorithm {
	w, n := l.Window(), l.Burst
	return []Algorithm{
		&fixedWindow{w: w, n: n},
		&slidingLog{w: w, n: n},
		&slidingCounter{w: w, n: n},
		&gcra{name: "token bucket", p: l.Token},
		&gcra{name: "leaky bucket (queue)", p: l.Leaky},
	}
}

type fixedWindow struct {
	w     time.Duration
	n     int
	index int64
	count int
}

func (a *fixedWindow) Name() string { return "fixed window" }

func (a *fixedWindow) Offer(at time.Duration) (bool, time.Duration, time.Duration) {
	if i := int64(at / a.w); i != a.index {
		a.index, a.count = i, 0
	}
	if a.count < a.n {
		a.count++
		return true, at, 0
	}
	return false, 0, time.Duration(a.index+1)*a.w - at
}

// slidingLog keeps the time of every accepted arrival in the last window.
type slidingLog struct {
	w   time.Duration
	n   int
	log []time.Duration
}

func (a *slidingLog) Name() string { return "sliding window (log)" }

func (a *slidingLog) Offer(at time.Duration) (bool, time.Duration, time.Duration) {
	for len(a.log) > 0 && a.log[0] <= at-a.w {
		a.log = a.log[1:]
	}
	if len(a.log) < a.n {
		a.log = append(a.log, at)
		return true, at, 0
	}
	return false, 0, a.log[0] + a.w - at
}

// slidingCounter is the two-counter approximation: this window's count plus
// the last window's, weighted by how much of it still overlaps.
type slidingCounter struct {
	w           time.Duration
	n           int
	index       int64
	prev, count int
}

func (a *slidingCounter) Name() string { return "sliding window (counter)" }

func (a *slidingCounter) Offer(at time.Duration) (bool, time.Duration, time.Duration) {
	i := int64(at / a.w)
	switch {
	case i == a.index+1:
		a.index, a.prev, a.count = i, a.count, 0
	case i != a.index:
		a.index, a.prev, a.count = i, 0, 0
	}
	elapsed := at - time.Duration(i)*a.w
	overlap := 1 - float64(elapsed)/float64(a.w)
	if float64(a.prev)*overlap+float64(a.count) < float64(a.n) {
		a.count++
		return true, at, 0
	}
	return false, 0, a.retryAfter(at, i, elapsed)
}

// retryAfter is how long until the approximation would accept: later in
// this window, once the previous window's weight has shrunk enough, or in
// the next one, once this window's weight has.
func (a *slidingCounter) retryAfter(at time.Duration, i int64, elapsed time.Duration) time.Duration {
	// Accepted at elapsed e iff weight*(1 - e/w) + count < n.
	after := func(weight, count int) (time.Duration, bool) {
		if count >= a.n {
			return 0, false
		}
		if weight == 0 {
			return 0, true
		}
		e := float64(a.w) * (1 - float64(a.n-count)/float64(weight))
		return time.Duration(math.Floor(max(e, -1))) + 1, true
	}
	if e, ok := after(a.prev, a.count); ok && e > elapsed && e < a.w {
		return e - elapsed
	}
	start := time.Duration(i+1) * a.w
	e, _ := after(a.count, 0)
	return start + max(e, 0) - at
}

// gcra is a lane of internal/leaky: the service's own decisions.
type gcra struct {
	name    string
	p       leaky.Policy
	state   leaky.State
	recent  []leaky.Recent
	pending []time.Duration // slots of admitted jobs, to count those waiting
}

func (a *gcra) Name() string { return a.name }

// epoch anchors simulated time for internal/leaky, which works in
// time.Time.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (a *gcra) Offer(at time.Duration) (bool, time.Duration, time.Duration) {
	for len(a.pending) > 0 && a.pending[0] <= at {
		a.pending = a.pending[1:]
	}
	d, st, recent := leaky.Decide(a.state, a.recent, epoch.Add(at), a.p, 1, len(a.pending))
	if !d.Admitted {
		return false, 0, d.RetryAfter
	}
	a.state, a.recent = st, recent
	send := d.Slot.Sub(epoch)
	i, _ := slices.BinarySearch(a.pending, send)
	a.pending = slices.Insert(a.pending, i, send)
	return true, send, 0
}

// Decision is what one algorithm did with one attempt.
type Decision struct {
	Arrival    time.Duration
	Accepted   bool
	Send       time.Duration // accepted
	RetryAfter time.Duration // refused
}

// Result is one algorithm's run.
type Result struct {
	Algorithm string
	Service   bool // the lane is the tenant's own policy
	Decisions []Decision
	Accepted  int
	Rejected  int
	// Attempts counts every offer, retries included.
	Attempts     int
	MaxWait      time.Duration
	MaxInWindow  int // most sends in any window of the limit's length
	MaxPerSecond int // most sends in any one second
}

// Run offers arrivals (sorted or not) to each algorithm: one attempt each,
// no retries.
func Run(l Limit, arrivals []time.Duration) []Result {
	sorted := slices.Clone(arrivals)
	slices.Sort(sorted)
	var out []Result
	for _, a := range Algorithms(l) {
		r := Result{Algorithm: a.Name(), Service: l.Service != "" && a.Name() == laneName(l.Service)}
		for _, at := range sorted {
			ok, send, ra := a.Offer(at)
			r.record(Decision{Arrival: at, Accepted: ok, Send: send, RetryAfter: ra})
		}
		r.finish(l)
		out = append(out, r)
	}
	return out
}

func laneName(mode string) string {
	if mode == "token" {
		return "token bucket"
	}
	return "leaky bucket (queue)"
}

func (r *Result) record(d Decision) {
	r.Decisions = append(r.Decisions, d)
	r.Attempts++
	if d.Accepted {
		r.Accepted++
		r.MaxWait = max(r.MaxWait, d.Send-d.Arrival)
	} else {
		r.Rejected++
	}
}

func (r *Result) finish(l Limit) {
	var sends []time.Duration
	for _, d := range r.Decisions {
		if d.Accepted {
			sends = append(sends, d.Send)
		}
	}
	slices.Sort(sends)
	r.MaxInWindow = MaxIn(sends, l.Window())
	r.MaxPerSecond = MaxIn(sends, time.Second)
}

// MaxIn is the most of sorted times in any half-open window [t, t+w).
func MaxIn(sorted []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i := range sorted {
		for j < len(sorted) && sorted[j] < sorted[i]+w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// Client is how a client answers a refusal in a retry storm.
type Client int

const (
	// AtOnce tries again after RetryAtOnce, whatever it was told.
	AtOnce Client = iota
	// HonourRetryAfter waits the Retry-After it was given, plus up to 10%
	// (and at least 100 ms) of random jitter.
	HonourRetryAfter
)

// RetryAtOnce is how soon an impatient client tries again.
const RetryAtOnce = 50 * time.Millisecond

// StormHorizon bounds a retry storm: a client still refused by then gives
// up.
const StormHorizon = 10 * time.Minute

// Storm offers clients that arrive at arrivals and, when refused, try
// again as client says, until accepted or StormHorizon. The jitter comes
// from seed, so a run can be repeated.
func Storm(l Limit, arrivals []time.Duration, client Client, seed uint64) []Result {
	var out []Result
	for _, a := range Algorithms(l) {
		rng := rand.New(rand.NewPCG(seed, 1))
		r := Result{Algorithm: a.Name(), Service: l.Service != "" && a.Name() == laneName(l.Service)}
		q := attemptQueue{}
		for i, at := range arrivals {
			heap.Push(&q, attempt{at: at, client: i})
		}
		for q.Len() > 0 {
			next := heap.Pop(&q).(attempt)
			ok, send, ra := a.Offer(next.at)
			r.record(Decision{Arrival: next.at, Accepted: ok, Send: send, RetryAfter: ra})
			if ok {
				continue
			}
			wait := RetryAtOnce
			if client == HonourRetryAfter {
				jitter := max(100*time.Millisecond, ra/10)
				wait = ra + time.Duration(rng.Int64N(int64(jitter)+1))
			}
			if again := next.at + wait; again <= StormHorizon {
				heap.Push(&q, attempt{at: again, client: next.client})
			}
		}
		r.Rejected = 0 // in a storm, what counts is attempts and who got in
		for _, d := range r.Decisions {
			if !d.Accepted {
				r.Rejected++
			}
		}
		r.finish(l)
		out = append(out, r)
	}
	return out
}

type attempt struct {
	at     time.Duration
	client int
}

type attemptQueue []attempt

func (q attemptQueue) Len() int { return len(q) }
func (q attemptQueue) Less(i, j int) bool {
	if q[i].at == q[j].at {
		return q[i].client < q[j].client
	}
	return q[i].at < q[j].at
}
func (q attemptQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *attemptQueue) Push(x any)   { *q = append(*q, x.(attempt)) }
func (q *attemptQueue) Pop() any {
	old := *q
	a := old[len(old)-1]
	*q = old[:len(old)-1]
	return a
}

// Scenarios are the built-in arrival traces, by name.
var Scenarios = []string{"burst", "steady", "slightly-too-fast", "window-edge", "retry-storm"}

// Scenario returns the arrivals of a built-in scenario under l.
func Scenario(name string, l Limit) ([]time.Duration, error) {
	T, w := l.Interval, l.Window()
	var out []time.Duration
	switch name {
	case "burst": // a quiet spell, then three times the burst at once
		for range 3 * l.Burst {
			out = append(out, 0)
		}
	case "steady": // exactly at the rate for 60 intervals
		for i := range 60 {
			out = append(out, time.Duration(i)*T)
		}
	case "slightly-too-fast": // 10% over the rate for 100 intervals
		for i := range 110 {
			out = append(out, time.Duration(i)*T*100/110)
		}
	case "window-edge": // a burst just before a window ends, another as the next begins
		for range l.Burst {
			out = append(out, w-10*time.Millisecond)
		}
		for range l.Burst {
			out = append(out, w)
		}
	case "retry-storm": // five times the burst at once, each client trying until it gets in
		for range 5 * l.Burst {
			out = append(out, 0)
		}
	default:
		return nil, fmt.Errorf("unknown scenario %q: use one of %v", name, Scenarios)
	}
	return out, nil
}
