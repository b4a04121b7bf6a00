package queuetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/queue"
	"throttler/internal/testutil"
)

// runner drives one store through one sequence of ops against the model.
// The store's goroutines call its handler (the downstream); everything
// else, the model included, runs on the runner's goroutine.
type runner struct {
	t     testing.TB
	d     ModelDriver
	clk   *stepClock
	m     *model
	cfg   Config
	store queue.Store
	stop  func()
	step  int
	op    Op
	fail  *ModelFailure
	ctx   context.Context
	// payloads: each job's payload says its number in the run
	payloads int
	trace    bool

	polMu sync.Mutex
	pols  map[string]PolicySpec

	mu         sync.Mutex
	gen        int // the process: a crash starts the next one
	crashing   bool
	crashArmed bool
	crashReq   bool
	answer     Answer
	maxT       map[string]time.Duration
	inHandler  int             // handlers of this process running (not parked)
	parked     []*parking      // handlers waiting on the clock
	events     []writeEvent    // writes not yet seen by the model
	pending    map[string]bool // handlers returned, outcome not yet seen recorded
}

type parking struct {
	at  time.Time
	ch  chan struct{}
	gen int
}

type writeEvent struct {
	job        queue.Job
	at         time.Time
	answer     Answer
	retryAfter time.Duration
	crash      bool // the process dies right after this write
}

// runModelOps runs ops on a fresh store and returns the first failure.
func runModelOps(t testing.TB, d ModelDriver, ops []Op) (fail *ModelFailure) {
	r := &runner{
		t: t, d: d, clk: newStepClock(T0), m: newModel(d.Known), ctx: context.Background(),
		pols: map[string]PolicySpec{}, maxT: map[string]time.Duration{}, pending: map[string]bool{},
		answer: Answer{Kind: AnswerOK}, trace: os.Getenv("THROTTLER_MODEL_TRACE") != "",
	}
	for _, name := range modelTenants {
		r.pols[name] = defaultModelPolicy
		r.maxT[name] = defaultModelPolicy.Interval
	}
	r.cfg = Config{Clock: r.clk, Policy: r.policy}
	s, err := d.Open(t, r.cfg)
	if err != nil {
		return &ModelFailure{Step: -1, Kind: "open", Msg: err.Error()}
	}
	r.store = s
	r.startConsume()
	defer func() {
		r.stop()
		r.store.Close()
	}()
	for i, op := range ops {
		r.step, r.op = i, op
		r.logf("step %d: %v", i, op)
		r.do(op)
		if r.fail == nil {
			r.settleAndProcess()
		}
		if r.fail == nil {
			r.checkAll()
		}
		if r.fail != nil {
			return r.fail
		}
	}
	r.step, r.op = len(ops), Op{}
	r.logf("drain")
	r.drain()
	return r.fail
}

func (r *runner) logf(format string, args ...any) {
	if r.trace {
		r.t.Logf("T0+%-8v "+format, append([]any{r.clk.Now().Sub(T0)}, args...)...)
	}
}

func (r *runner) failf(kind, format string, args ...any) {
	if r.fail != nil {
		return
	}
	r.fail = &ModelFailure{Step: r.step, Op: r.op, At: r.clk.Now().Sub(T0), Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

func (r *runner) policy(tenant string) leaky.Policy {
	r.polMu.Lock()
	p, ok := r.pols[tenant]
	r.polMu.Unlock()
	if !ok {
		p = defaultModelPolicy
	}
	lp := leaky.Policy{Interval: p.Interval, Burst: p.Burst, Capacity: p.Capacity}
	for _, w := range p.Windows {
		lp.Windows = append(lp.Windows, leaky.Window{N: w.N, Length: w.Length})
	}
	return lp
}

func (r *runner) startConsume() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r.mu.Lock()
	gen := r.gen
	r.mu.Unlock()
	s := r.store
	go func() {
		done <- s.Consume(ctx, r.handler(gen), queue.ConsumeOptions{Lead: modelLead, Concurrency: 1024})
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					r.failf("consume", "Consume: %v", err)
				}
			case <-time.After(30 * time.Second):
				panic("model: Consume did not return within 30s of its context's end")
			}
		})
	}
}

// handler is the downstream (and the dispatcher's part of waiting for the
// slot): it writes the request at the job's DispatchAt on the fake clock
// and answers as the current Answer says.
func (r *runner) handler(gen int) queue.Handler {
	released := queue.Outcome{Result: queue.Released}
	return func(ctx context.Context, j queue.Job) queue.Outcome {
		r.mu.Lock()
		if gen != r.gen || r.crashing {
			r.mu.Unlock()
			return released // this process is dead: nothing is written
		}
		r.inHandler++
		r.mu.Unlock()
		if j.DispatchAt.After(r.clk.Now()) && !r.park(ctx, gen, j.DispatchAt) {
			r.leave(gen, "")
			return released
		}
		r.mu.Lock()
		if gen != r.gen || r.crashing {
			if gen == r.gen {
				r.inHandler--
			}
			r.mu.Unlock()
			return released
		}
		w := r.clk.Now()
		a := r.answer
		ev := writeEvent{job: j, at: w, answer: a, retryAfter: time.Duration(a.N) * r.maxT[j.Tenant]}
		if r.crashArmed {
			// kill -9 now: the request is written, its outcome never
			// recorded.
			r.crashArmed, r.crashReq, r.crashing = false, true, true
			ev.crash = true
			r.events = append(r.events, ev)
			r.inHandler--
			r.mu.Unlock()
			<-ctx.Done()
			return released
		}
		r.events = append(r.events, ev)
		r.mu.Unlock()
		var o queue.Outcome
		switch a.Kind {
		case AnswerOK:
			o = queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: w}
		case AnswerPushback:
			o = queue.Outcome{Result: queue.Retry, Status: 429, Error: "429 Too Many Requests", SentAt: w, PauseUntil: w.Add(ev.retryAfter)}
		case AnswerRetry:
			o = queue.Outcome{Result: queue.Retry, Status: 503, Error: "503 Service Unavailable", SentAt: w, NotBefore: w.Add(a.Backoff)}
		case AnswerPermanent:
			o = queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 Bad Request", SentAt: w}
		case AnswerTimeout:
			if !r.park(ctx, gen, w.Add(a.Timeout)) {
				r.leave(gen, "")
				return released
			}
			o = queue.Outcome{Result: queue.Retry, Error: "timeout", SentAt: w, NotBefore: r.clk.Now().Add(a.Backoff)}
		}
		r.leave(gen, j.ID)
		return o
	}
}

// leave ends a handler's run; id: its outcome is now the store's to record.
func (r *runner) leave(gen int, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen {
		return
	}
	r.inHandler--
	if id != "" {
		r.pending[id] = true
	}
}

// park waits until the runner moves the clock to at (false: the process
// died meanwhile).
func (r *runner) park(ctx context.Context, gen int, at time.Time) bool {
	p := &parking{at: at, ch: make(chan struct{}), gen: gen}
	r.mu.Lock()
	if gen != r.gen || r.crashing {
		r.mu.Unlock()
		return false
	}
	r.parked = append(r.parked, p)
	r.inHandler--
	r.mu.Unlock()
	select {
	case <-p.ch:
		return true // counted in again by wake
	case <-ctx.Done():
		r.mu.Lock()
		if i := slices.Index(r.parked, p); i >= 0 {
			r.parked = slices.Delete(r.parked, i, i+1)
			if gen == r.gen {
				r.inHandler++
			}
		}
		r.mu.Unlock()
		return false
	}
}

// wake lets the handlers parked until now go on.
func (r *runner) wake(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := r.parked[:0]
	for _, p := range r.parked {
		if p.at.After(now) {
			kept = append(kept, p)
			continue
		}
		if p.gen == r.gen {
			r.inHandler++
		}
		close(p.ch)
	}
	r.parked = kept
}

func (r *runner) nextParked() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at time.Time
	for _, p := range r.parked {
		if at.IsZero() || p.at.Before(at) {
			at = p.at
		}
	}
	return at, !at.IsZero()
}

// settle waits until the store has done all it will do at this moment:
// no handler running, every outcome returned recorded, nothing handed over
// that the handler has not taken, the jobs the model expects written
// written, and the store no longer starting new waits. It reports a crash
// asked for by the handler.
func (r *runner) settle(expect []*mjob) (crash bool) {
	polls, poll, timeout := 3, 300*time.Microsecond, 3*time.Second
	if testutil.Race {
		polls, poll, timeout = 4, time.Millisecond, 10*time.Second
	}
	start := time.Now()
	lastAfter, stable := r.clk.afterCalls(), 0
	for {
		r.mu.Lock()
		crashReq, inH := r.crashReq, r.inHandler
		var pend []string
		for id := range r.pending {
			pend = append(pend, id)
		}
		parked := 0
		for _, p := range r.parked {
			if p.gen == r.gen {
				parked++
			}
		}
		written := map[string]bool{}
		for _, ev := range r.events {
			written[ev.job.ID] = true
		}
		r.mu.Unlock()
		if crashReq {
			return true
		}
		left := 0
		for _, id := range pend {
			if j, err := r.store.Job(r.ctx, id); err == nil && j.State != queue.StateDispatching {
				r.mu.Lock()
				delete(r.pending, id)
				r.mu.Unlock()
				continue
			}
			left++
		}
		inflight := 0
		for _, name := range modelTenants {
			if st, err := r.store.Tenant(r.ctx, name); err == nil {
				inflight += st.InFlight
			}
		}
		missing := 0
		for _, j := range expect {
			if !written[j.id] {
				missing++
			}
		}
		busy := inH > 0 || left > 0 || inflight != parked || (r.d.Quiet != nil && !r.d.Quiet(r.store))
		if a := r.clk.afterCalls(); a != lastAfter {
			lastAfter, stable = a, 0
		}
		if !busy && missing == 0 {
			if stable++; stable >= polls {
				return false
			}
		} else {
			stable = 0
		}
		if time.Since(start) > timeout {
			if busy {
				r.failf("settle", "the store did not settle within %v: %d handlers running, %d outcomes not recorded, %d in flight for %d parked", timeout, inH, left, inflight, parked)
			}
			return false // what was not written is the model's to report
		}
		time.Sleep(poll)
	}
}

// settleAndProcess settles the store at this moment and brings the model
// up to date with what it did, crashing and restarting when the handler
// asks to.
func (r *runner) settleAndProcess() {
	for r.fail == nil {
		now := r.clk.Now()
		crash := r.settle(r.m.due(now))
		r.process(now)
		if r.fail != nil {
			return
		}
		if crash {
			r.crash(0)
			continue
		}
		for _, j := range r.m.due(now) {
			at, _ := j.tn.pz.real(j.slot)
			sj, err := r.store.Job(r.ctx, j.id)
			r.failf("not sent", "%s due at T0+%v was not sent by T0+%v (the store has it %s, dispatch_at T0+%v, %v)", r.m.describe(j), at.Sub(T0), now.Sub(T0), sj.State, sj.DispatchAt.Sub(T0), err)
			return
		}
		if r.d.TakeStartLag != nil {
			if lag := r.d.TakeStartLag(r.store); lag != 0 && r.m.known&DefectStartLag == 0 {
				r.failf("start lag", "the store's start-lag estimate is %v on a clock where every send starts at once (issue 12 #1): it schedules every job that much late", lag)
			}
		}
		return
	}
}

// process applies the writes seen and the answers due at now to the model.
func (r *runner) process(now time.Time) {
	r.mu.Lock()
	evs := r.events
	r.events = nil
	r.mu.Unlock()
	order := func(ev writeEvent) (int, int) {
		if j := r.m.byID[ev.job.ID]; j != nil {
			return slices.Index(r.m.order, j.tn.name), j.n
		}
		return len(r.m.order), 0
	}
	slices.SortStableFunc(evs, func(a, b writeEvent) int {
		ta, na := order(a)
		tb, nb := order(b)
		if ta != tb {
			return ta - tb
		}
		return na - nb
	})
	// Writes of one moment are checked against the schedule as it was
	// before any of their answers: they were all under way already.
	var written []*mjob
	for _, ev := range evs {
		j := r.checkWrite(ev)
		if r.fail != nil {
			return
		}
		written = append(written, j)
	}
	var reserved []reservation
	for i, ev := range evs {
		if rv, ok := r.answerWrite(written[i], ev); ok {
			reserved = append(reserved, rv)
		}
	}
	for _, j := range r.m.jobs {
		if j.state == msInFlight && !j.answerAt.IsZero() && !j.answerAt.After(now) {
			reserved = append(reserved, r.onFailure(j, now, now.Add(j.answer.Backoff), j.writeAt))
		}
	}
	r.adopt(reserved, now)
}

// reservation is a new slot the model gave a job after a failed attempt,
// to be checked against (and, where the store has a choice, taken from) the
// store's.
type reservation struct {
	j         *mjob
	slot      time.Time // the model's (with windows: the earliest allowed)
	exact     bool
	backoffed bool // the backoff, not the schedule, set the slot
}

// checkWrite checks a write against the model.
func (r *runner) checkWrite(ev writeEvent) *mjob {
	j := r.m.byID[ev.job.ID]
	if j == nil {
		r.failf("unknown job", "the downstream got job %s (%s), which the model never admitted", ev.job.ID, ev.job.Payload)
		return nil
	}
	tn := j.tn
	desc := r.m.describe(j)
	r.logf("write %s attempt %d (store due T0+%v), answer %v", desc, ev.job.Attempts, ev.job.DispatchAt.Sub(T0), map[bool]string{true: "crash", false: Op{Kind: OpDownstream, Answer: ev.answer}.String()}[ev.crash])
	if j.state != msWaiting {
		r.failf("sent twice", "%s written at T0+%v while %s (writes so far %v): only a crash between a write and its recorded outcome allows a repeat", desc, ev.at.Sub(T0), j.state, relTimes(j.writes))
		return nil
	}
	due, ok := tn.pz.real(j.slot)
	switch {
	case !ok:
		r.failf("sent while held", "%s written at T0+%v while its tenant is held by an operator", desc, ev.at.Sub(T0))
	case !due.Equal(ev.at):
		r.failf("send time", "%s written at T0+%v, due at T0+%v (the store handed it due at T0+%v)", desc, ev.at.Sub(T0), due.Sub(T0), ev.job.DispatchAt.Sub(T0))
	case ev.job.Attempts != j.attempts+1:
		r.failf("attempts", "%s handed over as attempt %d, want %d", desc, ev.job.Attempts, j.attempts+1)
	case ev.job.Tenant != tn.name || string(ev.job.Payload) != j.payload || ev.job.IdempotencyKey != j.key:
		r.failf("job", "%s handed over as tenant %q payload %s key %q, want %q %s %q", desc, ev.job.Tenant, ev.job.Payload, ev.job.IdempotencyKey, tn.name, j.payload, j.key)
	case j.attempts == 0 && len(j.writes) == 0 && !j.disturbed && ev.at.Sub(j.admittedAt) != j.promised:
		r.failf("honest delay", "%s admitted at T0+%v with expected_delay %v, first written after %v", desc, j.admittedAt.Sub(T0), j.promised, ev.at.Sub(j.admittedAt))
	}
	if r.fail != nil {
		return nil
	}
	r.checkRate(j, ev.at)
	j.writes = append(j.writes, ev.at)
	j.writeAt = ev.at
	j.possiblySent, j.pushedBack = false, false
	j.state = msInFlight
	return j
}

// answerWrite applies a write's answer to the model.
func (r *runner) answerWrite(j *mjob, ev writeEvent) (reservation, bool) {
	tn := j.tn
	if ev.crash {
		j.state, j.answerAt = msInFlight, time.Time{}
		return reservation{}, false
	}
	switch ev.answer.Kind {
	case AnswerOK:
		r.recorded(j, ev.at)
		j.state = msSucceeded
	case AnswerPermanent:
		r.recorded(j, ev.at)
		j.state = msFailed
	case AnswerPushback:
		r.recorded(j, ev.at)
		j.pushedBack = true
		until := ev.at.Add(ev.retryAfter)
		for _, w := range tn.wins {
			w.entries = append(w.entries, mentry{at: j.slot, weight: j.cost}) // the resend is a send of its own
		}
		tn.pz = tn.pz.pushback(ev.at, until, j.slot)
		tn.tat = laterOf(tn.tat, tn.pz.tenantTime(ev.at).Add(tn.tau()))
		tn.disturb()
		j.state = msWaiting
		r.m.expireIfLate(j, ev.at)
		tn.persistedTAT = tn.tat
	case AnswerRetry:
		return r.onFailure(j, ev.at, ev.at.Add(ev.answer.Backoff), ev.at), true
	case AnswerTimeout:
		j.state, j.answer, j.answerAt = msInFlight, ev.answer, ev.at.Add(ev.answer.Timeout)
	}
	return reservation{}, false
}

// recorded counts an attempt whose outcome the store records.
func (r *runner) recorded(j *mjob, sentAt time.Time) {
	j.attempts++
	j.tn.lastRecorded = laterOf(j.tn.lastRecorded, sentAt)
	j.tn.persistedTAT = j.tn.tat
}

// onFailure: a 5xx or a timeout answered at now; the next attempt no
// sooner than notBefore.
func (r *runner) onFailure(j *mjob, now, notBefore, sentAt time.Time) reservation {
	tn := j.tn
	j.attempts++
	tn.lastRecorded = laterOf(tn.lastRecorded, sentAt)
	r0 := laterOf(tn.pz.tenantTime(now), tn.tat.Add(-tn.tau()))
	backoffed := tn.pz.tenantTime(notBefore).After(r0)
	slot, exact := r.m.reserve(tn, j, now, notBefore)
	j.state, j.answerAt = msWaiting, time.Time{}
	return reservation{j: j, slot: slot, exact: exact, backoffed: backoffed}
}

// adopt settles the slots of attempts that failed at now. Outcomes of one
// moment reach the store in any order, so jobs of one tenant may swap
// slots: the model checks the set, and takes the store's assignment (with
// windows, each slot at or after the earliest the model allows).
func (r *runner) adopt(rs []reservation, now time.Time) {
	byTenant := map[*mtenant][]reservation{}
	for _, rv := range rs {
		byTenant[rv.j.tn] = append(byTenant[rv.j.tn], rv)
	}
	for _, name := range r.m.order {
		tn := r.m.tenants[name]
		group := byTenant[tn]
		if len(group) == 0 {
			continue
		}
		exact := true
		for _, rv := range group {
			exact = exact && rv.exact
		}
		if len(group) == 1 && exact {
			rv := group[0]
			r.m.placeReserved(tn, rv.j, rv.slot, rv.backoffed)
		} else {
			var want, got []time.Time
			stored := make([]time.Time, len(group))
			for i, rv := range group {
				sj, err := r.store.Job(r.ctx, rv.j.id)
				if err != nil {
					r.failf("lost", "%s after a failed attempt: %v", r.m.describe(rv.j), err)
					return
				}
				want = append(want, rv.slot)
				got = append(got, sj.Slot)
				stored[i] = sj.Slot
			}
			slices.SortFunc(want, func(a, b time.Time) int { return a.Compare(b) })
			slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
			for i := range want {
				if (exact && !got[i].Equal(want[i])) || (!exact && got[i].Before(want[i])) {
					r.failf("retry slot", "tenant %s: attempts failed at T0+%v were given slots %v, want %s %v", name, now.Sub(T0), relTimes(got), map[bool]string{true: "", false: "at or after"}[exact], relTimes(want))
					return
				}
			}
			for i, rv := range group {
				r.m.placeReserved(tn, rv.j, stored[i], rv.backoffed)
			}
		}
		for _, rv := range group {
			r.m.expireIfLate(rv.j, now)
		}
		tn.persistedTAT = tn.tat
	}
}

// checkRate checks a write of j at at against the tenant's rate and windows,
// as given to the job's slot: GCRA on the writes (no write sooner than the
// previous writes allow with the burst's tolerance), counting attempts
// (invariant 1) and, apart, counting each job's cost (the schedule spaces
// a cost-c job c intervals from the next); and at most N sends in any
// window of each length.
func (r *runner) checkRate(j *mjob, at time.Time) {
	tn := j.tn
	// The policy the slot was given under, or the one in force now,
	// whichever allows more.
	T, tau := min(j.tag.T, tn.pol.Interval), max(j.tag.tau, tn.tau())
	burst := tau/T + 1
	if at.Before(tn.rateTAT1.Add(-tau)) {
		r.failf("rate", "tenant %s: %s written at T0+%v, sooner than the rate allows (T0+%v; T %v, burst %d); the tenant's last writes: %v", tn.name, r.m.describe(j), at.Sub(T0), tn.rateTAT1.Add(-tau).Sub(T0), T, burst, relTimes(lastN(tn.writes, 6)))
		return
	}
	if at.Before(tn.rateTAT.Add(-tau)) {
		r.failf("cost spacing", "tenant %s: %s written at T0+%v, sooner than the costs of the writes before allow (T0+%v; T %v, burst %d); the tenant's last writes: %v", tn.name, r.m.describe(j), at.Sub(T0), tn.rateTAT.Add(-tau).Sub(T0), T, burst, relTimes(lastN(tn.writes, 6)))
		return
	}
	tn.rateTAT = laterOf(tn.rateTAT, at).Add(time.Duration(j.cost) * T)
	tn.rateTAT1 = laterOf(tn.rateTAT1, at).Add(T)
	tn.writes = append(tn.writes, at)
	tn.lastWriteT, tn.lastWriteCost = T, j.cost
	pushedResend := j.pushedBack
	for _, w := range j.tag.wins {
		w.writes = append(w.writes, mentry{at: at, weight: j.cost})
		if pushedResend && r.m.known&DefectPushbackWindow != 0 {
			continue
		}
		n := 0
		var in []time.Time
		for _, e := range w.writes {
			if e.at.After(at.Add(-w.spec.Length)) {
				n += e.weight
				in = append(in, e.at)
			}
		}
		if n > w.spec.N {
			r.failf("window", "tenant %s: %d sends within %v (window %d/%v): %v", tn.name, n, at.Sub(in[0]), w.spec.N, w.spec.Length, relTimes(in))
			return
		}
	}
}

// advance moves the clock to to, stopping at every moment something is due:
// a wait of the store, a parked handler, an event of the model.
func (r *runner) advance(to time.Time) {
	for r.fail == nil {
		now := r.clk.Now()
		next := to
		if w, ok := r.clk.next(); ok && w.Before(next) {
			next = w
		}
		if p, ok := r.nextParked(); ok && p.Before(next) {
			next = p
		}
		if e := r.m.next(now); !e.IsZero() && e.Before(next) {
			next = e
		}
		next = laterOf(next, now)
		r.clk.Set(next)
		r.wake(next)
		r.m.expire(next)
		r.settleAndProcess()
		if !next.Before(to) {
			return
		}
	}
}

// crash kills the process now and restarts it down later.
func (r *runner) crash(down time.Duration) {
	x := r.clk.Now()
	r.mu.Lock()
	r.crashing, r.crashArmed = true, false
	r.mu.Unlock()
	restart, err := r.d.Crash(r.t, r.store)
	if err != nil {
		r.failf("crash", "%v", err)
		return
	}
	r.stop()
	r.store.Close()
	r.mu.Lock()
	r.gen++
	r.crashing, r.crashReq, r.inHandler = false, false, 0
	r.pending, r.parked, r.events = map[string]bool{}, nil, nil
	r.mu.Unlock()
	r.m.crash()
	if down > 0 {
		r.clk.Set(x.Add(down))
	}
	at := r.clk.Now()
	s, err := restart(r.t, r.cfg)
	if err != nil {
		r.failf("restart", "%v", err)
		r.store = nil
		return
	}
	r.store = s
	r.recover(at)
	r.startConsume()
}

// recover checks what the restarted store made of each waiting job and
// takes its times: a job keeps its slot unless that is too soon; then it
// goes at or after the restart, and no sooner than one interval after the
// last write of its tenant (recorded, or written and lost in the crash).
func (r *runner) recover(at time.Time) {
	for _, name := range r.m.order {
		tn := r.m.tenants[name]
		T := tn.pol.Interval
		if r.m.known&DefectRestartCost != 0 && len(tn.writes) > 0 {
			// issue 12 (found by the model): a restart spaces the next
			// send one interval after the last one, whatever its cost.
			last := tn.writes[len(tn.writes)-1]
			tn.rateTAT = earliest(tn.rateTAT, laterOf(last.Add(tn.lastWriteT), tn.rateTAT1))
		}
		// The next send no sooner than the writes so far allow (lost in
		// the crash or not), and one interval after the last recorded one.
		var bound time.Time
		if len(tn.writes) > 0 {
			bound = tn.rateTAT.Add(-tn.tau())
		}
		if !tn.lastRecorded.IsZero() {
			bound = laterOf(bound, tn.lastRecorded.Add(T))
		}
		held := !tn.pz.held.IsZero()
		for _, j := range tn.waiting() {
			sj, err := r.store.Job(r.ctx, j.id)
			if err != nil {
				r.failf("lost", "%s after a restart: %v", r.m.describe(j), err)
				return
			}
			if !sj.State.Waiting() {
				r.failf("lost", "%s is %s after a restart, want waiting", r.m.describe(j), sj.State)
				return
			}
			if held {
				if !sj.Slot.Equal(j.slot) {
					r.failf("restart", "%s of a held tenant moved by a restart: slot %v, was %v", r.m.describe(j), sj.Slot.Sub(T0), j.slot.Sub(T0))
				}
				continue
			}
			old, _ := tn.pz.real(j.slot)
			switch {
			case sj.DispatchAt.Before(at):
				r.failf("restart", "%s due at T0+%v after a restart at T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), at.Sub(T0))
			case !bound.IsZero() && sj.DispatchAt.Before(bound):
				r.failf("restart spacing", "%s due at T0+%v after a restart at T0+%v, sooner than its tenant's writes so far allow (T0+%v; T %v; writes %v)", r.m.describe(j), sj.DispatchAt.Sub(T0), at.Sub(T0), bound.Sub(T0), T, relTimes(lastN(tn.writes, 4)))
			case !j.possiblySent && sj.DispatchAt.Before(old):
				r.failf("restart", "%s moved earlier by a restart: T0+%v, was T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), old.Sub(T0))
			}
			if r.fail != nil {
				return
			}
			if !sj.Slot.Equal(j.slot) {
				j.slot, j.tag = sj.Slot, tn.tagNow()
				tn.recordWindows(sj.Slot, j.cost)
				tn.tat = laterOf(tn.tat, sj.Slot.Add(time.Duration(j.cost)*T))
			}
		}
		// The next send no sooner than one interval after the last one
		// recorded, whatever the schedule says.
		if !tn.lastRecorded.IsZero() {
			tn.tat = laterOf(tn.tat, tn.lastRecorded.Add(T+tn.tau()-tn.pz.shift))
		}
		tn.persistedTAT = tn.tat
	}
}

// do runs one op.
func (r *runner) do(op Op) {
	now := r.clk.Now()
	switch op.Kind {
	case OpEnqueue:
		r.enqueue(op, now)
	case OpCancel:
		r.cancel(op, now)
	case OpRetry:
		r.retry(op, now)
	case OpHold, OpResume:
		r.hold(op, now)
	case OpAdvance:
		r.advance(now.Add(max(op.D, 0)))
	case OpDownstream:
		r.mu.Lock()
		r.answer = op.Answer
		r.mu.Unlock()
	case OpReload:
		tn := r.m.tenants[op.Tenant]
		if tn == nil || op.Policy.Interval <= 0 || op.Policy.Burst < 1 {
			return
		}
		r.polMu.Lock()
		r.pols[op.Tenant] = op.Policy
		r.polMu.Unlock()
		r.m.reload(tn, op.Policy, now)
		r.mu.Lock()
		r.maxT[op.Tenant] = tn.maxT
		r.mu.Unlock()
	case OpCrash:
		r.crash(max(op.D, 0))
	case OpCrashOnWrite:
		r.mu.Lock()
		r.crashArmed = true
		r.mu.Unlock()
	}
}

func (r *runner) enqueue(op Op, now time.Time) {
	tn := r.m.tenants[op.Tenant]
	if tn == nil || len(op.Jobs) == 0 {
		return
	}
	var statusDelay time.Duration
	if len(tn.wins) > 0 {
		st, err := r.store.Tenant(r.ctx, tn.name)
		if err != nil {
			r.failf("tenant", "%v", err)
			return
		}
		statusDelay = st.ExpectedDelay
	}
	jobs := make([]queue.NewJob, len(op.Jobs))
	payloads := make([]string, len(op.Jobs))
	for i, spec := range op.Jobs {
		r.payloads++
		payloads[i] = fmt.Sprintf(`{"m":%d}`, r.payloads)
		jobs[i] = queue.NewJob{Payload: json.RawMessage(payloads[i]), IdempotencyKey: spec.Key, Cost: spec.Cost}
		if spec.Deadline != 0 {
			jobs[i].Deadline = now.Add(spec.Deadline)
		}
	}
	out, err := r.store.Enqueue(r.ctx, tn.name, jobs)
	if err != nil {
		r.failf("enqueue", "Enqueue: %v", err)
		return
	}
	if len(out) != len(jobs) {
		r.failf("enqueue", "Enqueue answered %d of %d jobs", len(out), len(jobs))
		return
	}
	firstUse := map[string]int{}
	admittedAny := false
	inCall := map[*mjob]bool{}
	for i, spec := range op.Jobs {
		a := out[i]
		where := fmt.Sprintf("job %d of %d", i+1, len(jobs))
		if spec.Key != "" {
			if f, ok := firstUse[spec.Key]; ok {
				b := out[f]
				if a.Job.ID != b.Job.ID || a.Duplicate != b.Admitted() || (a.Rejected == nil) != (b.Rejected == nil) || (a.Impossible == nil) != (b.Impossible == nil) {
					r.failf("idempotency", "%s repeats key %q of job %d in the call: answered %s, the first %s", where, spec.Key, f+1, admissionString(a), admissionString(b))
					return
				}
				continue
			}
			firstUse[spec.Key] = i
			if mj := tn.keys[spec.Key]; mj != nil {
				if r.m.known&DefectRepeatCost != 0 && max(spec.Cost, 1) > tn.maxCost() && a.Impossible != nil && a.Impossible.Reason == queue.ReasonCostTooLarge {
					continue
				}
				if !a.Duplicate || a.Job.ID != mj.id || a.ExpectedDelay != mj.promisedFirst || a.QueueDepth != mj.admitDepth {
					r.failf("idempotency", "%s repeats key %q of %s (delay %v, depth %d): answered %s", where, spec.Key, r.m.describe(mj), mj.promisedFirst, mj.admitDepth, admissionString(a))
					return
				}
				continue
			}
		}
		var deadline time.Time
		if spec.Deadline != 0 {
			deadline = now.Add(spec.Deadline)
		}
		dec := r.m.decide(tn, now, spec.Cost, deadline, inCall)
		if !r.checkAdmission(tn, dec, a, where, now, deadline) {
			return
		}
		if dec.kind != mAdmitted || a.Job.ID == "" || a.Rejected != nil || a.Impossible != nil {
			continue
		}
		j := &mjob{n: len(r.m.jobs) + 1, id: a.Job.ID, tn: tn, key: spec.Key, cost: max(spec.Cost, 1), deadline: deadline, payload: payloads[i]}
		if !r.admitJob(tn, j, dec, a, where, now) {
			return
		}
		if len(tn.wins) > 0 && !admittedAny && j.cost == 1 && a.ExpectedDelay != statusDelay {
			r.failf("expected delay", "tenant %s reported expected_delay %v, and the job admitted right after waits %v", tn.name, statusDelay, a.ExpectedDelay)
			return
		}
		admittedAny = true
		inCall[j] = true
		j.promisedFirst, j.admitDepth = a.ExpectedDelay, a.QueueDepth
		r.m.jobs = append(r.m.jobs, j)
		r.m.byID[j.id] = j
		tn.jobs = append(tn.jobs, j)
		if spec.Key != "" {
			tn.keys[spec.Key] = j
		}
	}
	if admittedAny {
		tn.persistedTAT = tn.tat
	}
}

// checkAdmission compares a store's answer with the model's decision (all
// but an admission's details, which admitJob checks).
func (r *runner) checkAdmission(tn *mtenant, dec mdecision, a queue.Admission, where string, now, deadline time.Time) bool {
	got := admissionString(a)
	depth := len(tn.waiting())
	switch dec.kind {
	case mCostTooLarge:
		if a.Impossible == nil || a.Impossible.Reason != queue.ReasonCostTooLarge || a.Impossible.MaxCost != dec.maxCost {
			r.failf("admission", "%s for %s: want 422 cost_too_large (at most %d), got %s", where, tn.name, dec.maxCost, got)
			return false
		}
	case mWouldExpire:
		if a.Impossible == nil || a.Impossible.Reason != queue.ReasonWouldExpire || (dec.exact && a.Impossible.ExpectedDelay != dec.delay) || a.Impossible.ExpectedDelay < dec.delay {
			r.failf("admission", "%s for %s: want 422 would_expire (delay %v past the deadline T0+%v), got %s", where, tn.name, dec.delay, deadline.Sub(T0), got)
			return false
		}
	case mRejected:
		reason := queue.ReasonQueueFull
		if tn.pol.Capacity == 0 {
			reason = queue.ReasonRateLimited
		}
		if a.Rejected == nil || a.Rejected.Reason != reason || a.Rejected.QueueDepth != depth || a.QueueDepth != depth {
			r.failf("admission", "%s for %s: want 429 %s with depth %d (the %s is full), got %s", where, tn.name, reason, depth, dec.raWhy, got)
			return false
		}
		r.checkRetryAfter(tn, dec, a.Rejected.RetryAfter, where, now)
	case mAdmitted:
		if len(tn.wins) > 0 && a.Impossible != nil && a.Impossible.Reason == queue.ReasonWouldExpire && !deadline.IsZero() &&
			a.Impossible.ExpectedDelay >= dec.delay && now.Add(a.Impossible.ExpectedDelay).After(deadline) {
			return true // a window gave it a later slot than the earliest possible, and that is past its deadline
		}
		if a.Rejected != nil || a.Impossible != nil || a.Job.ID == "" || a.Duplicate {
			r.failf("admission", "%s for %s: want admitted with delay %v (depth %d before), got %s", where, tn.name, dec.delay, depth, got)
			return false
		}
	}
	return r.fail == nil
}

func (r *runner) checkRetryAfter(tn *mtenant, dec mdecision, ra time.Duration, where string, now time.Time) {
	if dec.raWhy == "count" && r.m.known&DefectCountRetryAfter != 0 || dec.raWhy == "window" && r.m.known&DefectWindowRetryAfter != 0 {
		return
	}
	if tn.pz.paused(now) {
		// What a refusal says during a pause depends on how the pause will
		// end: check only that it does not invite a retry before the end.
		if until := tn.pz.until; tn.pz.held.IsZero() && ra < until.Sub(now) {
			r.failf("retry-after", "%s for %s: Retry-After %v during a pause that ends in %v", where, tn.name, ra, until.Sub(now))
		}
		return
	}
	if (dec.raExact && ra != dec.ra) || ra < dec.ra {
		how := "exactly"
		if !dec.raExact {
			how = "at least"
		}
		r.failf("retry-after", "%s for %s refused (%s) with Retry-After %v, want %s %v: a job arriving then is admitted, not a moment sooner", where, tn.name, dec.raWhy, ra, how, dec.ra)
	}
}

// admitJob checks an admission's details and takes it into the model.
func (r *runner) admitJob(tn *mtenant, j *mjob, dec mdecision, a queue.Admission, where string, now time.Time) bool {
	slot := dec.slot
	if !dec.exact {
		if a.Job.Slot.Before(dec.slot) {
			r.failf("window slot", "%s for %s: slot T0+%v, sooner than every window allows (T0+%v)", where, tn.name, a.Job.Slot.Sub(T0), dec.slot.Sub(T0))
			return false
		}
		slot = a.Job.Slot
	}
	told := tn.pz.told(slot, now)
	depth := len(tn.waiting()) + 1
	switch {
	case a.ExpectedDelay != told.Sub(now):
		r.failf("expected delay", "%s for %s: expected_delay %v, want %v (slot T0+%v)", where, tn.name, a.ExpectedDelay, told.Sub(now), slot.Sub(T0))
	case !a.Job.DispatchAt.Equal(told):
		r.failf("admission", "%s for %s: dispatch_at T0+%v, want T0+%v", where, tn.name, a.Job.DispatchAt.Sub(T0), told.Sub(T0))
	case a.QueueDepth != depth:
		r.failf("depth", "%s for %s: queue_depth %d, want %d", where, tn.name, a.QueueDepth, depth)
	case a.Job.State != queue.StateQueued || a.Job.Attempts != 0:
		r.failf("admission", "%s for %s: admitted as %s with %d attempts", where, tn.name, a.Job.State, a.Job.Attempts)
	case a.Capacity != tn.pol.Capacity:
		r.failf("admission", "%s for %s: capacity %d, want %d", where, tn.name, a.Capacity, tn.pol.Capacity)
	}
	if r.fail != nil {
		return false
	}
	r.m.take(tn, j, now, slot)
	// The bound: queued jobs that wait (not going at once) never exceed
	// the capacity.
	n, oldest := 0, now
	for _, w := range tn.waiting() {
		if w.attempts == 0 && !w.possiblySent && (tn.pz.told(w.slot, now).After(now) || tn.pz.paused(now)) {
			n++
			oldest = earliest(oldest, w.admittedAt)
		}
	}
	if c := tn.capacityBound(oldest); n > c {
		r.failf("bound", "tenant %s holds %d queued jobs waiting, capacity %d", tn.name, n, c)
		return false
	}
	return true
}

func (r *runner) pick(op Op, want func(*mjob) bool) *mjob {
	var list []*mjob
	for _, j := range r.m.jobs {
		if op.Pick%2 == 1 || want(j) {
			list = append(list, j)
		}
	}
	if len(list) == 0 {
		return nil
	}
	return list[(op.Pick/2)%len(list)]
}

func (r *runner) cancel(op Op, now time.Time) {
	j := r.pick(op, func(j *mjob) bool { return j.state == msWaiting })
	if j == nil {
		return
	}
	got, err := r.store.Cancel(r.ctx, j.id)
	if j.state != msWaiting {
		var se *queue.StateError
		if !errors.As(err, &se) || se.State != storeState(j) {
			r.failf("cancel", "cancel of %s (%s): want a StateError %s, got %v", r.m.describe(j), j.state, storeState(j), err)
		}
		return
	}
	if err != nil || got.State != queue.StateCancelled {
		r.failf("cancel", "cancel of waiting %s: %+v %v", r.m.describe(j), got.State, err)
		return
	}
	j.state = msCancelled
	tn := j.tn
	// The last job of the schedule gives its place back (leaky, no
	// windows); only in memory until the tenant's record is next written.
	if tn.pol.Burst == 1 && len(tn.wins) == 0 && j.slot.Add(time.Duration(j.cost)*tn.pol.Interval).Equal(tn.tat) {
		tn.tat = j.slot
	}
}

func (r *runner) retry(op Op, now time.Time) {
	j := r.pick(op, func(j *mjob) bool { return j.state == msFailed })
	if j == nil {
		return
	}
	tn := j.tn
	a, err := r.store.Retry(r.ctx, j.id)
	if j.state != msFailed {
		var se *queue.StateError
		if !errors.As(err, &se) || se.State != storeState(j) {
			r.failf("retry", "retry of %s (%s): want a StateError %s, got %v", r.m.describe(j), j.state, storeState(j), err)
		}
		return
	}
	if err != nil {
		r.failf("retry", "retry of failed %s: %v", r.m.describe(j), err)
		return
	}
	dec := r.m.decide(tn, now, j.cost, j.deadline, nil)
	if !r.checkAdmission(tn, dec, a, "retry of "+r.m.describe(j), now, j.deadline) || dec.kind != mAdmitted || a.Impossible != nil {
		return
	}
	if a.Job.ID != j.id {
		r.failf("retry", "retry of %s answered job %s", r.m.describe(j), a.Job.ID)
		return
	}
	if r.admitJob(tn, j, dec, a, "retry of "+r.m.describe(j), now) {
		tn.persistedTAT = tn.tat
	}
}

func (r *runner) hold(op Op, now time.Time) {
	tn := r.m.tenants[op.Tenant]
	if tn == nil {
		return
	}
	var st queue.TenantStatus
	var err error
	before := tn.pz
	if op.Kind == OpHold {
		st, err = r.store.Pause(r.ctx, tn.name)
		tn.pz = tn.pz.hold(now)
		tn.tat = laterOf(tn.tat, tn.pz.tenantTime(now).Add(tn.tau())) // jobs admitted while held go one interval apart after it
		tn.disturb()
	} else {
		st, err = r.store.Resume(r.ctx, tn.name)
		tn.pz = tn.pz.resume(now)
		tn.disturb() // jobs admitted while held were told: as if resumed then
	}
	if tn.pz != before {
		tn.persistedTAT = tn.tat
	}
	if err != nil {
		r.failf("hold", "%v of %s: %v", op.Kind, tn.name, err)
		return
	}
	if st.Held != !tn.pz.held.IsZero() || st.Paused != tn.pz.paused(now) {
		r.failf("hold", "%v of %s answered held %v paused %v", op.Kind, tn.name, st.Held, st.Paused)
	}
}

// storeState is the state the store should show for j.
func storeState(j *mjob) queue.JobState {
	switch j.state {
	case msWaiting:
		if j.attempts == 0 {
			return queue.StateQueued
		}
		return queue.StateRetrying
	case msInFlight:
		return queue.StateDispatching
	case msSucceeded:
		return queue.StateSucceeded
	case msFailed:
		return queue.StateFailed
	case msCancelled:
		return queue.StateCancelled
	}
	return queue.StateExpired
}

// checkAll compares every tenant and every job with the model.
func (r *runner) checkAll() {
	now := r.clk.Now()
	for _, name := range r.m.order {
		tn := r.m.tenants[name]
		st, err := r.store.Tenant(r.ctx, name)
		if err != nil {
			r.failf("tenant", "Tenant(%s): %v", name, err)
			return
		}
		depth, inflight := len(tn.waiting()), tn.count(msInFlight)
		tt := tn.pz.tenantTime(now)
		s0 := laterOf(tt, tn.tat.Add(-tn.tau()))
		delay := tn.pz.told(s0, now).Sub(now)
		if len(tn.wins) > 0 {
			delay = tn.pz.told(tn.earliestWindow(s0, 1), now).Sub(now)
		}
		var until time.Time
		if tn.pz.held.IsZero() && now.Before(tn.pz.until) {
			until = tn.pz.until
		}
		switch {
		case st.QueueDepth != depth:
			r.failf("depth", "tenant %s: queue_depth %d, want %d", name, st.QueueDepth, depth)
		case st.InFlight != inflight:
			r.failf("in flight", "tenant %s: in_flight %d, want %d", name, st.InFlight, inflight)
		case len(tn.wins) == 0 && st.ExpectedDelay != delay, len(tn.wins) > 0 && st.ExpectedDelay < delay:
			r.failf("expected delay", "tenant %s: expected_delay %v, want %v", name, st.ExpectedDelay, delay)
		case st.Held != !tn.pz.held.IsZero() || st.Paused != tn.pz.paused(now) || !st.PausedUntil.Equal(until):
			r.failf("pause", "tenant %s: paused %v held %v until %v, want %v %v %v", name, st.Paused, st.Held, st.PausedUntil, tn.pz.paused(now), !tn.pz.held.IsZero(), until)
		}
		if r.fail != nil {
			return
		}
	}
	for _, j := range r.m.jobs {
		want := storeState(j)
		sj, err := r.store.Job(r.ctx, j.id)
		if err == nil && sj.State != want && want == queue.StateExpired && sj.State.Waiting() {
			// The store expires jobs when it next looks at them: give it a moment.
			testutil.WaitFor(r.t, 5*time.Second, "expiry", func() bool {
				sj, err = r.store.Job(r.ctx, j.id)
				return err != nil || sj.State != want
			})
		}
		switch {
		case err != nil:
			r.failf("lost", "%s: %v", r.m.describe(j), err)
		case sj.State != want:
			r.failf("job state", "%s is %s, want %s", r.m.describe(j), sj.State, want)
		case j.state == msWaiting && !sj.DispatchAt.Equal(j.tn.pz.told(j.slot, now)):
			r.failf("dispatch at", "%s dispatch_at T0+%v, want T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), j.tn.pz.told(j.slot, now).Sub(T0))
		case j.state == msWaiting && sj.Attempts != j.attempts:
			r.failf("attempts", "%s has %d attempts, want %d", r.m.describe(j), sj.Attempts, j.attempts)
		}
		if r.fail != nil {
			return
		}
	}
}

// drain lets every job finish: a healthy downstream, every hold resumed,
// time enough; then nothing may still wait.
func (r *runner) drain() {
	r.mu.Lock()
	r.answer = Answer{Kind: AnswerOK}
	r.mu.Unlock()
	for _, name := range r.m.order {
		if !r.m.tenants[name].pz.held.IsZero() {
			r.hold(Op{Kind: OpResume, Tenant: name}, r.clk.Now())
		}
	}
	r.settleAndProcess()
	for i := 0; i < 100 && r.fail == nil; i++ {
		busy := false
		for _, j := range r.m.jobs {
			busy = busy || j.state == msWaiting || j.state == msInFlight
		}
		if !busy {
			break
		}
		r.advance(r.clk.Now().Add(5 * time.Second))
	}
	if r.fail != nil {
		return
	}
	r.checkAll()
	for _, j := range r.m.jobs {
		if r.fail == nil && (j.state == msWaiting || j.state == msInFlight) {
			r.failf("lost", "%s still %s after the drain", r.m.describe(j), j.state)
		}
	}
}

func admissionString(a queue.Admission) string {
	switch {
	case a.Impossible != nil:
		return fmt.Sprintf("422 %s (delay %v, max cost %d)", a.Impossible.Reason, a.Impossible.ExpectedDelay, a.Impossible.MaxCost)
	case a.Rejected != nil:
		return fmt.Sprintf("429 %s retry after %v (depth %d)", a.Rejected.Reason, a.Rejected.RetryAfter, a.Rejected.QueueDepth)
	case a.Duplicate:
		return fmt.Sprintf("200 duplicate of %s (delay %v, depth %d)", shortID(a.Job.ID), a.ExpectedDelay, a.QueueDepth)
	}
	return fmt.Sprintf("202 %s delay %v depth %d", shortID(a.Job.ID), a.ExpectedDelay, a.QueueDepth)
}

func relTimes(ts []time.Time) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Sub(T0).String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
