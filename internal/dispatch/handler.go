package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A downstream may be a Go handler in this process instead of a URL
// (DESIGN.md section 6d). Its attempt is an HTTP attempt without the
// connection: the same deadline check, breaker, gate (the tenant's rate
// and windows, the downstream's ceiling, the shared gate of a store many
// processes share), timeout and classification. The gate is passed in the
// goroutine that calls the handler, right before the call, and the call's
// start is what the gate spaces the next send from (Ticket.WroteNow), as the
// first byte's write is for HTTP: invariant 1 holds at the handler's start.

// Call is a Go handler as the dispatcher calls it, for a job of the
// downstream named downstream, in two steps: Call itself prepares, before
// the gate (whatever takes time: building the handler's job and context),
// and returns invoke, which the dispatcher runs right after the gate with
// the instant the gate recorded as the send (started: the next send is
// spaced from it) and which only calls the handler, so that instant and
// the handler's start are as close as they can be. The public handler package
// maps the handler's error onto a Reply (handler.Decide). ctx ends at the downstream's
// timeout; it is not ended by the service stopping (a call once begun is
// not cut short, as a request being written is not).
type Call func(ctx context.Context, downstream string, job queue.Job) (invoke func(started time.Time) Reply)

// Reply is what a handler's call came to, in the words of the attempt's
// outcome (queue.Result).
type Reply struct {
	// Result is how the call ended:
	//   - Succeeded: the job is done (a nil error), as for a 2xx;
	//   - Retry: a failure, retried with backoff through the same pacing,
	//     counting toward max_attempts and the breaker, as a 5xx or a
	//     timeout (or a pushback: see Pushback);
	//   - Failed: the job fails for good, not retried, as for a 4xx;
	//   - Cancelled: the job is not to be done; it ends cancelled.
	// Any other (the zero Result) is a failure, as Retry.
	Result queue.Result
	// Pushback, with Retry, makes it a pushback rather than a failure, as
	// queue.Outcome's Retry with PauseUntil is: the vendor asked to wait
	// After (0: the backoff), the tenant pauses as for a 429 with
	// Retry-After, the job keeps its place and no attempt is used up.
	Pushback bool
	After    time.Duration
	// Body is kept as the job's response, as an HTTP answer's body is
	// (nil: none; the answer before stays).
	Body []byte
	// Error is the job's last_error ("" for Succeeded).
	Error string
}

// callHandler makes one attempt of a job whose downstream is a Go handler.
func (d *Dispatcher) callHandler(stop context.Context, job queue.Job, r Route, br *breaker, probe bool) (queue.Outcome, string) {
	a := d.newAttempt(stop, job, r, r.Outbound)
	defer a.end()
	// The handler's context ends when the attempt's timeout runs out
	// (a.ctx), which stands still while the send waits at the gate; its
	// deadline is set once the call starts.
	ctx := &callCtx{Context: a.ctx}
	done := make(chan called, 1) // the call goes on alone after a timeout: it must not block
	go a.passAndCall(ctx, r.Call, done)
	var c called
	select {
	case c = <-done:
	case <-a.ctx.Done():
		c.timedOut = true
	}
	timedOut := a.timeout.end() || c.timedOut
	a.mu.Lock()
	a.over = true
	at, refused := a.sentAt, a.refused
	a.mu.Unlock()
	now := d.clock.Now()
	switch {
	case at.IsZero() && c.gateErr != nil:
		br.report(now, probe, unsent) // nothing called: says nothing of the handler
		return unsentOutcome(cmp.Or(refused, c.gateErr)), ""
	case timedOut && !c.returned:
		msg := fmt.Sprintf("timeout after %v: the handler %s did not return (its context ended; a handler that ignores it keeps running while the job is retried)", r.Timeout, r.Downstream)
		return d.failure(job, r, br, probe, queue.Outcome{SentAt: at}, now, msg), "timeout"
	}
	return d.classifyReply(job, r, br, probe, at, c.reply, now)
}

// keepReturned is what the job keeps of the bytes a handler returned: as
// much as the downstream's keep_response_bytes, status 0 (no HTTP).
func keepReturned(r Route, body []byte) *queue.Response {
	o := r.Outbound
	if o == nil { // a route made without config (tests): the defaults
		o, _ = outbound.Compile("handler", config.Downstream{Handler: "handler"})
	}
	return o.Keep(0, nil, body, false)
}

// callCtx is the handler's context: the attempt's, with the deadline its
// timeout gives from the call's start (Deadline, for a handler that passes
// it on to its vendor's SDK); zero, no deadline, until then.
type callCtx struct {
	context.Context
	mu       sync.Mutex
	deadline time.Time
}

func (c *callCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, !c.deadline.IsZero()
}

func (c *callCtx) setDeadline(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = at
}

// called is what passAndCall came to.
type called struct {
	gateErr  error // the gate let nothing be called
	reply    Reply
	returned bool // the handler returned (or panicked)
	timedOut bool // the attempt stopped waiting for it
}

// passAndCall prepares the call, waits at the gate, then calls the handler
// at once in the same goroutine (no hand-off between the gate and the call
// that a busy machine could stretch). The call's start is stamped as the
// send's write once the gate's lock is held (WroteNow): a wait for the
// lock comes before the instant recorded, not between it and the call.
func (a *attempt) passAndCall(ctx *callCtx, call Call, done chan<- called) {
	var invoke func(time.Time) Reply
	prepared := safeCall(func() Reply { invoke = call(ctx, a.route.Downstream, a.job); return Reply{} })
	ticket, err := a.passGate()
	if err != nil {
		done <- called{gateErr: err}
		return
	}
	at := ticket.WroteNow() // wakes the next send waiting on the lanes
	a.wrote(at)
	ctx.setDeadline(at.Add(a.route.Timeout))
	// Waking it, a busy machine can take the CPU from this thread for
	// milliseconds: the next send is spaced from the call's real start,
	// read here, right before it (the gate lets nothing go before it).
	if now := a.d.clock.Now(); now.After(at) {
		ticket.Later(now)
		a.mu.Lock()
		a.sentAt = now
		a.mu.Unlock()
		at = now
	}
	if invoke == nil { // the preparation panicked: an attempt that failed
		done <- called{reply: prepared, returned: true}
		return
	}
	done <- called{reply: safeCall(func() Reply { return invoke(at) }), returned: true}
}

// safeCall runs f; a panic is a failure, retried, as asynq's processor
// treats one.
func safeCall(f func() Reply) (rep Reply) {
	defer func() {
		if p := recover(); p != nil {
			rep = Reply{Result: queue.Retry, Error: fmt.Sprintf("the handler panicked: %v\n%s", p, firstLines(debug.Stack(), 12))}
		}
	}()
	return f()
}

// firstLines is the start of a stack trace, fit for last_error.
func firstLines(b []byte, n int) string {
	for i, c := range b {
		if c == '\n' {
			if n--; n == 0 {
				return string(b[:i])
			}
		}
	}
	return string(b)
}

// classifyReply turns a handler's reply into the job's outcome, as
// classifyAnswer does an HTTP answer's (and with the same classes, so
// metrics and the breaker see a handler as they see a URL).
func (d *Dispatcher) classifyReply(job queue.Job, r Route, br *breaker, probe bool, at time.Time, rep Reply, now time.Time) (queue.Outcome, string) {
	out := queue.Outcome{SentAt: at}
	if rep.Body != nil {
		out.Response = keepReturned(r, rep.Body)
	}
	msg := cmp.Or(rep.Error, "the handler failed")
	switch {
	case rep.Result == queue.Succeeded:
		br.report(now, probe, healthy)
		out.Result = queue.Succeeded
		return out, "2xx"
	case rep.Result == queue.Retry && rep.Pushback:
		br.report(now, probe, healthy) // it answers, and asks us to wait
		wait := rep.After
		if wait <= 0 {
			wait = d.backoff(job.Attempts)
		}
		return d.pushback(job, r, out, now.Add(wait), msg, false), "429"
	case rep.Result == queue.Failed:
		br.report(now, probe, healthy)
		out.Result, out.Error = queue.Failed, msg
		return out, "4xx"
	case rep.Result == queue.Cancelled:
		br.report(now, probe, healthy)
		out.Result, out.Error = queue.Cancelled, msg
		return out, "4xx"
	}
	return d.failure(job, r, br, probe, out, now, msg), "5xx"
}
