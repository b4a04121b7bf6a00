package queuetest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/testutil"
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
	// kept keeps the trace for a failure (ModelFailure.Trace) when it is
	// not logged as it goes: a seed that fails only now and then, beside
	// the others (a CI run), shows its run.
	keptMu sync.Mutex
	kept   *strings.Builder

	polMu sync.Mutex
	pols  map[string]PolicySpec

	mu         sync.Mutex
	gen        int // the process: a crash starts the next one
	crashing   bool
	crashArmed bool
	crashReq   bool
	answer     Answer
	maxT       map[string]time.Duration
	frozen     map[int]bool // processes stopped (SIGSTOP) past their lease: OpStale
	staleSends []string     // what woken stale processes' handlers were allowed to write
	staleAsked int          // how many times they asked (checkStaleSend)
	inHandler  int          // handlers of this process running (not parked)
	// waitedInVain: the writes the last settle waited for until its
	// timeout, and did not see.
	waitedInVain int
	parked       []*parking      // handlers waiting on the clock
	events       []writeEvent    // writes not yet seen by the model
	pending      map[string]bool // handlers returned, outcome not yet seen recorded
	// answering: timeouts answered at this moment, not yet seen recorded.
	// A write's outcome waits for them (cond), so that the store records
	// the outcomes of one moment in the order the model applies them.
	answering map[string]bool
	cond      *sync.Cond
}

type parking struct {
	at     time.Time
	ch     chan struct{}
	gen    int
	answer string // the job whose timeout this is ("" none)
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
		pols: map[string]PolicySpec{}, maxT: map[string]time.Duration{}, pending: map[string]bool{}, answering: map[string]bool{},
		answer: Answer{Kind: AnswerOK}, trace: os.Getenv("THROTTLER_MODEL_TRACE") != "",
	}
	if !r.trace {
		r.kept = &strings.Builder{}
		defer func() {
			if fail != nil {
				r.keptMu.Lock() // a stopped process's goroutine may still log
				fail.Trace = r.kept.String()
				r.keptMu.Unlock()
			}
		}()
	}
	for _, name := range modelTenants {
		r.pols[name] = defaultModelPolicy
		r.maxT[name] = defaultModelPolicy.Interval
	}
	r.cond = sync.NewCond(&r.mu)
	r.cfg = Config{Clock: r.clk, Policy: r.policy, Caps: r.caps}
	s, err := d.Open(t, r.cfg)
	if err != nil {
		return &ModelFailure{Step: -1, Kind: "open", Msg: err.Error()}
	}
	r.store = s
	r.startConsume()
	defer func() {
		r.stop()
		if r.store != nil { // nil after a restart that failed (r.fail says why)
			r.store.Close()
		}
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
	if r.kept != nil {
		r.keptMu.Lock()
		fmt.Fprintf(r.kept, "\nT0+%-8v "+format, append([]any{r.clk.Now().Sub(T0)}, args...)...)
		r.keptMu.Unlock()
	}
}

func (r *runner) failf(kind, format string, args ...any) {
	if r.fail != nil {
		return
	}
	r.fail = &ModelFailure{Step: r.step, Op: r.op, At: r.clk.Now().Sub(T0), Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// spec is tenant's policy as the run has it now.
func (r *runner) spec(tenant string) PolicySpec {
	r.polMu.Lock()
	defer r.polMu.Unlock()
	if p, ok := r.pols[tenant]; ok {
		return p
	}
	return defaultModelPolicy
}

func (r *runner) policy(tenant string) leaky.Policy {
	p := r.spec(tenant)
	lp := leaky.Policy{Interval: p.Interval, Burst: p.Burst, Capacity: p.Capacity, MaxScheduled: p.MaxScheduled}
	for _, w := range p.Windows {
		lp.Windows = append(lp.Windows, leaky.Window{N: w.N, Length: w.Length})
	}
	return lp
}

// caps gives a tenant's cap on attempts in flight, as its policy says;
// an attempt a crash cut short holds its place for modelCapTimeout.
func (r *runner) caps(tenant string) queue.Caps {
	return queue.Caps{Downstream: "model", Tenant: r.spec(tenant).MaxInFlight, Timeout: modelCapTimeout}
}

// modelCapTimeout is the downstream's timeout the caps are told: how long
// an attempt written before a crash may hold its place.
const modelCapTimeout = 200 * time.Millisecond

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
			r.checkStaleSend(ctx, gen, j)
			return released // this process is dead: nothing is written
		}
		r.inHandler++
		r.mu.Unlock()
		if j.DispatchAt.After(r.clk.Now()) && !r.park(ctx, gen, j.DispatchAt, "") {
			r.leave(gen, "")
			return released
		}
		r.mu.Lock()
		// The outcomes of timeouts answered at this moment are recorded
		// before this write's (and before a crash at it).
		for gen == r.gen && !r.crashing && len(r.answering) > 0 && (r.answer.Kind != AnswerTimeout || r.crashArmed) {
			r.cond.Wait()
		}
		if gen != r.gen || r.crashing {
			if gen == r.gen {
				r.inHandler--
			}
			r.mu.Unlock()
			r.checkStaleSend(ctx, gen, j)
			return released
		}
		w := r.clk.Now()
		a := r.answer
		ev := writeEvent{job: j, at: w, answer: a, retryAfter: time.Duration(a.N*j.EffectiveCost()) * r.maxT[j.Tenant]}
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
			if !r.park(ctx, gen, w.Add(a.Timeout), j.ID) {
				r.leave(gen, "")
				return released
			}
			o = queue.Outcome{Result: queue.Retry, Error: "timeout", SentAt: w, NotBefore: r.clk.Now().Add(a.Backoff)}
		}
		r.leave(gen, j.ID)
		return o
	}
}

// checkStaleSend is the dispatcher's last question before a write
// (queue.MaySend), asked by a handler of a process stopped past its lease
// (OpStale) that has woken: its store must say no, as the partition is
// another worker's now. (A handler of a process killed never gets here.)
func (r *runner) checkStaleSend(ctx context.Context, gen int, j queue.Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.frozen[gen] {
		return
	}
	r.staleAsked++
	if queue.MaySend(ctx) {
		r.staleSends = append(r.staleSends, fmt.Sprintf("job %s of %s (attempt %d, due T0+%v)", j.ID, j.Tenant, j.Attempts, j.DispatchAt.Sub(T0)))
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
func (r *runner) park(ctx context.Context, gen int, at time.Time, answer string) bool {
	p := &parking{at: at, ch: make(chan struct{}), gen: gen, answer: answer}
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

// answers registers the timeouts answered at now, before the clock moves
// there (so that no write of that moment can miss them).
func (r *runner) answers(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.parked {
		if !p.at.After(now) && p.gen == r.gen && p.answer != "" {
			r.answering[p.answer] = true
		}
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
	if len(r.parked) == 0 {
		return time.Time{}, false
	}
	at := r.parked[0].at
	for _, p := range r.parked[1:] {
		at = earliest(at, p.at)
	}
	return at, true
}

// settle waits until the store has done all it will do at this moment:
// no handler running, every outcome returned recorded, nothing handed over
// that the handler has not taken, the jobs the model expects written
// written, and the store no longer starting new waits. It reports a crash
// asked for by the handler.
func (r *runner) settle(expect []mdue) (crash bool) {
	// The timeout is the store's time to finish what it does at one
	// moment: seconds are a busy machine's, never a promise's (six seeds
	// run at once).
	polls, poll, timeout := 3, 300*time.Microsecond, 10*time.Second
	if testutil.Race {
		polls, poll, timeout = 4, time.Millisecond, 10*time.Second
	}
	start := time.Now()
	lastAfter, stable := r.clk.afterCalls(), 0
	var rounds, notQuiet, newWaits int // what kept it from settling, for a failure
	for {
		rounds++
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
				if r.answering[id] {
					delete(r.answering, id)
					r.cond.Broadcast()
				}
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
		for _, d := range expect {
			missing += d.missing(written)
		}
		quiet := r.d.Quiet == nil || r.d.Quiet(r.store)
		if !quiet {
			notQuiet++
		}
		busy := inH > 0 || left > 0 || inflight != parked || !quiet
		if a := r.clk.afterCalls(); a != lastAfter {
			lastAfter, stable = a, 0
			newWaits++
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
				why := ""
				if r.d.Busy != nil {
					why = ": " + r.d.Busy(r.store)
				}
				r.failf("settle", "the store did not settle within %v: %d handlers running, %d outcomes not recorded, %d in flight for %d parked%s (of %d looks: %d not quiet, %d with new waits on the clock)", timeout, inH, left, inflight, parked, why, rounds, notQuiet, newWaits)
			}
			r.waitedInVain = missing // what was not written is the model's to report
			return false
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
		r.m.expire(now)
		crash := r.settle(r.m.due(now))
		r.process(now)
		if r.fail != nil {
			return
		}
		if crash {
			r.crash(0)
			continue
		}
		if n := r.waitedInVain; n > 0 {
			r.waitedInVain = 0
			if len(r.m.due(now)) == 0 {
				// The model expected writes it then did not require: its
				// expectation is wrong (each such moment cost a settle's
				// whole timeout, and failed now and then when the store
				// was busy just as it ran out), or the store made them
				// only after the timeout, seconds late.
				r.failf("settle", "the model waited out the settle's timeout for %d writes at T0+%v that it then did not require: the model's due is wrong, or the store wrote them only after the timeout", n, now.Sub(T0))
				return
			}
		}
		for _, d := range r.m.due(now) {
			// The first of them the model would have let go (one the
			// store could have sent instead is not written either).
			j := d.jobs[0]
			at, _ := j.tn.pz.real(j.slot)
			sj, err := r.store.Job(r.ctx, j.id)
			r.failf("not sent", "%s due at T0+%v was not sent by T0+%v (the store has it %s, dispatch_at T0+%v, %v; %d of the tenant's %d waiting jobs were due)", r.m.describe(j), at.Sub(T0), now.Sub(T0), sj.State, sj.DispatchAt.Sub(T0), err, d.n, len(d.jobs))
			return
		}
		if r.d.TakeStartLag != nil {
			if lag := r.d.TakeStartLag(r.store); lag != 0 && r.m.known&DefectStartLag == 0 {
				r.failf("start lag", "the store's start-lag estimate is %v on a clock where every send starts at once: it schedules every job that much late", lag)
			}
		}
		return
	}
}

// advance moves the clock to to, stopping at every moment something is due:
// a wait of the store, a parked handler, an event of the model.
func (r *runner) advance(to time.Time) {
	for r.fail == nil {
		now := r.clk.Now()
		next := to
		// A wait nobody listens to any more (cut short by a poke)
		// counts too: stopping there costs a moment and misses nothing.
		if w, ok := r.clk.Next(); ok && w.Before(next) {
			next = w
		}
		if p, ok := r.nextParked(); ok && p.Before(next) {
			next = p
		}
		if e := r.m.next(now); !e.IsZero() && e.Before(next) {
			next = e
		}
		next = laterOf(next, now)
		r.answers(next)
		r.clk.Set(next)
		r.wake(next)
		r.m.expire(next)
		r.settleAndProcess()
		if !next.Before(to) {
			return
		}
	}
}
