package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"throttler/internal/config"
	"throttler/internal/outbound"
	"throttler/internal/queue"
)

// A downstream may be a Go handler in this process instead of a URL
// (DESIGN.md section 6d). Its attempt is an HTTP attempt without the
// connection: the same deadline check, breaker, gate (the tenant's rate
// and windows, the downstream's ceiling, the shared gate of a store many
// processes share), timeout and classification. The gate is passed in the
// goroutine that calls the handler, right before the call, and the call's
// start is what the gate spaces the next send from (Ticket.Wrote), as the
// first byte's write is for HTTP: invariant 1 holds at the handler's start.

// Call is a Go handler as the dispatcher calls it, for a job of the
// downstream named downstream: the public handler package maps the
// handler's error onto a Reply. ctx ends at the
// downstream's timeout; it is not ended by the service stopping (a call
// once begun is not cut short, as a request being written is not).
type Call func(ctx context.Context, downstream string, job queue.Job) Reply

// Verdict is how a handler's call ended.
type Verdict int

const (
	// Done: the job is done (a nil error). The answer's 2xx.
	Done Verdict = iota
	// Failure: retried with backoff through the same pacing; counts
	// toward max_attempts and the breaker. A 5xx, or a timeout.
	Failure
	// Pushback: the vendor asked to wait Reply.After: the tenant pauses
	// as for a 429 with Retry-After; no attempt is used up.
	Pushback
	// Permanent: the job fails at once (a 4xx).
	Permanent
	// Cancel: the job is not to be done; it ends cancelled.
	Cancel
)

// Reply is what a handler's call came to.
type Reply struct {
	Verdict Verdict
	// After is how long a Pushback pauses the tenant (0: the backoff).
	After time.Duration
	// Body is kept as the job's response, as an HTTP answer's body is
	// (nil: none; the answer before stays).
	Body []byte
	// Error is the job's last_error ("" for Done).
	Error string
}

// callHandler makes one attempt of a job whose downstream is a Go handler.
func (d *Dispatcher) callHandler(stop context.Context, job queue.Job, r Route, br *breaker, probe bool) (queue.Outcome, string) {
	a := d.newAttempt(stop, job, r, r.Outbound)
	defer a.end()
	ctx, cancel := context.WithTimeout(a.ctx, r.Timeout) // a deadline the handler can read, beside the timeout
	defer cancel()
	done := make(chan called, 1) // the call goes on alone after a timeout: it must not block
	go a.passAndCall(ctx, r.Call, done)
	var c called
	select {
	case c = <-done:
	case <-ctx.Done():
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

// called is what passAndCall came to.
type called struct {
	gateErr  error // the gate let nothing be called
	reply    Reply
	returned bool // the handler returned (or panicked)
	timedOut bool // the attempt stopped waiting for it
}

// passAndCall waits at the gate, then calls the handler at once in the
// same goroutine (no hand-off between the gate and the call that a busy
// machine could stretch), stamping the call's start as the send's write.
func (a *attempt) passAndCall(ctx context.Context, call Call, done chan<- called) {
	ticket, err := a.passGate()
	if err != nil {
		done <- called{gateErr: err}
		return
	}
	at := a.d.clock.Now()
	ticket.Wrote(at)
	a.wrote(at)
	done <- called{reply: safeCall(ctx, call, a.route.Downstream, a.job), returned: true}
}

// safeCall calls the handler; a panic is a failure, retried, as asynq's
// processor treats one.
func safeCall(ctx context.Context, call Call, downstream string, job queue.Job) (rep Reply) {
	defer func() {
		if p := recover(); p != nil {
			rep = Reply{Verdict: Failure, Error: fmt.Sprintf("the handler panicked: %v\n%s", p, firstLines(debug.Stack(), 12))}
		}
	}()
	return call(ctx, downstream, job)
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
	switch rep.Verdict {
	case Done:
		br.report(now, probe, healthy)
		out.Result = queue.Succeeded
		return out, "2xx"
	case Pushback:
		br.report(now, probe, healthy) // it answers, and asks us to wait
		wait := rep.After
		if wait <= 0 {
			wait = d.backoff(job.Attempts)
		}
		return d.pushback(job, r, out, now.Add(wait), msg), "429"
	case Permanent:
		br.report(now, probe, healthy)
		out.Result, out.Error = queue.Failed, msg
		return out, "4xx"
	case Cancel:
		br.report(now, probe, healthy)
		out.Result, out.Error = queue.Cancelled, msg
		return out, "4xx"
	}
	return d.failure(job, r, br, probe, out, now, msg), "5xx"
}
