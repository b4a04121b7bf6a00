package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// attempt makes one attempt: it checks that the job may go (its deadline,
// the downstream's breaker), sends it (connect, wait at the gate for the
// slot and the lanes, write, read the answer) and classifies what came back.
func (d *Dispatcher) attempt(stop context.Context, job queue.Job) (queue.Outcome, string) {
	r := d.routes(job.Tenant)
	now := d.clock.Now()
	if !job.Deadline.IsZero() && now.After(job.Deadline) {
		return queue.Outcome{Result: queue.Expired}, ""
	}
	br := d.breaker(r.Downstream)
	// Asked as of the job's own time: a job handed over just before the
	// next probe is the probe.
	probe, until, ok := br.allow(clock.Later(now, job.DispatchAt))
	if !ok {
		// The downstream is failing: this job waits for the next probe,
		// first in its tenant's queue, and uses up none of its attempts.
		return queue.Outcome{Result: queue.Released, PauseUntil: until}, ""
	}
	if r.Call != nil {
		return d.callHandler(stop, job, r, br, probe)
	}
	o, err := d.outbound(r)
	if err != nil {
		br.report(now, probe, unsent)
		return queue.Outcome{Result: queue.Failed, Error: fmt.Sprintf("cannot build the request to %s: %v", r.Downstream, err)}, ""
	}
	a := d.newAttempt(stop, job, r, o)
	defer a.end()
	req, body, err := a.request()
	if err != nil {
		// Nothing is sent: the job asks what its downstream's config no
		// longer allows (a reload since its admission), which no retry
		// can change. The error names the config key.
		br.report(now, probe, unsent)
		return queue.Outcome{Result: queue.Failed, Error: fmt.Sprintf("cannot build the request to %s (its config changed since the job was admitted): %v", r.Downstream, err)}, ""
	}
	return d.classify(job, r, br, probe, a.send(req, body))
}

// attempt is one job's attempt in progress: what its steps share. It
// connects, waits at the gate for its slot and its lanes right before the
// request is written (passGate, from the goroutine that writes), writes, and
// reads the answer (send). The gate and the connection report from
// net/http's goroutines, hence mu.
type attempt struct {
	d      *Dispatcher
	job    queue.Job
	route  Route
	out    *outbound.Downstream // builds, signs and keeps the answer
	client *http.Client         // the transport of out's TLS config
	lanes  []Lane
	remote RemoteGate // the gate a shared store's processes pass too; nil: none

	stop context.Context // the service stopping
	// ctx is the request's. Once begun, an attempt is not cut short by a
	// stop: a request cut off mid-write would leave the downstream
	// guessing. gateCtx, the wait at the gate, is: nothing is written yet.
	ctx, gateCtx       context.Context
	cancel, cancelGate context.CancelFunc
	unwatchStop        func() bool
	timeout            *timeout

	mu sync.Mutex
	// sentAt is when the request was written; zero while it was not.
	sentAt time.Time
	// refused says why the gate let nothing be written (*HeldError,
	// errExpired, errStopped); nil if it did not refuse.
	refused error
	// paced is the last connection write armed to pass the gate.
	paced *pacedWrite
	// unpaced is the gate's ticket when the connection is not ours (no
	// pacedConn): the send counts as lasting until the attempt ends.
	unpaced *Ticket
	// grant is the shared gate's grant this attempt's write uses (nil:
	// none), confirmed once the request is written.
	grant *remoteGrant
	over  bool // the outcome is being decided: a late report changes nothing
}

// Why the gate let nothing be written, beside *HeldError.
var (
	errExpired = errors.New("deadline passed before the request could be written")
	errStopped = errors.New("the service is stopping: the send that waited at the gate goes back in line")
	errNotOurs = errors.New("the store took the job back (this worker no longer owns its partition): nothing was written")
)

// sent is what an attempt's send came to, for classify.
type sent struct {
	at       time.Time // when the request was written; zero if it was not
	answer   *answer   // nil: none (err says why)
	err      error
	refused  error // why the gate let nothing be written; nil if it did not refuse
	timedOut bool  // the downstream timeout ran out
}

// answer is the downstream's answer, read within the timeout.
type answer struct {
	status     int
	retryAfter string
	// exhausted: its rate limit fields (the route's style) say no room is
	// left for wait.
	exhausted bool
	wait      time.Duration
	body      []byte          // its first bytes (attempt.read)
	kept      *queue.Response // what the job keeps of it
}

func (d *Dispatcher) newAttempt(stop context.Context, job queue.Job, r Route, o *outbound.Downstream) *attempt {
	a := &attempt{d: d, job: job, route: r, out: o, lanes: r.lanes(job.Tenant, job.Cost), stop: stop}
	if r.Call == nil { // a Go handler sends nothing over HTTP
		a.client = d.clients.forTLS(o)
	}
	if d.shared != nil {
		req := queue.GateRequest{Downstream: r.Downstream, Tenant: job.Tenant, Policy: r.Policy, Ceiling: r.Ceiling, Cost: job.Cost}
		a.remote = func(ctx context.Context) (queue.GateAnswer, error) { return d.shared(ctx, req) }
	}
	a.ctx, a.cancel = context.WithCancel(context.WithoutCancel(stop))
	a.gateCtx, a.cancelGate = context.WithCancel(a.ctx)
	a.unwatchStop = context.AfterFunc(stop, a.cancelGate)
	a.timeout = startTimeout(d.clock, r.Timeout, a.cancel)
	return a
}

// end lets go of what the attempt holds, once its outcome is decided.
func (a *attempt) end() {
	a.timeout.end()
	a.unwatchStop()
	a.cancelGate()
	a.cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unpaced != nil {
		a.unpaced.Done()
	}
	a.grant.resolve(a.ctx, time.Time{}) // a grant its request never used
}

// request builds the downstream request as its config says (DESIGN.md
// sections 6 and 6a, internal/outbound), with the hook that arms the gate
// once a connection is ready, and returns its body (for Sign). The error
// is an *outbound.NotAllowedError.
func (a *attempt) request() (*http.Request, []byte, error) {
	trace := &httptrace.ClientTrace{GotConn: a.gotConn}
	j := a.job
	return a.out.Build(httptrace.WithClientTrace(a.ctx, trace), outbound.BuildJob{
		ID: j.ID, Tenant: j.Tenant, Attempt: j.Attempts, Payload: j.Payload, Request: j.Request})
}

// gotConn runs once the connection is ready, before the request is written
// (again after a dead idle connection: nothing was written on that one). The
// gate is passed at the write itself, in the goroutine that writes. On a
// connection that is not ours (a client not from NewClient) it is passed
// here instead, and nothing is written if it refuses.
func (a *attempt) gotConn(info httptrace.GotConnInfo) {
	pw := &pacedWrite{pass: a.passGate, wrote: a.wrote, clock: a.d.clock, done: make(chan struct{})}
	if pace(info.Conn, pw) {
		a.mu.Lock()
		a.paced = pw
		a.mu.Unlock()
		return
	}
	a.mu.Lock()
	if a.unpaced != nil {
		a.unpaced.Done()
		a.unpaced = nil
	}
	a.mu.Unlock()
	ticket, err := a.passGate()
	if err != nil {
		a.cancel() // nothing may be written
		return
	}
	a.mu.Lock()
	a.unpaced = ticket
	a.mu.Unlock()
	a.wrote(ticket.At)
}

// passGate waits at the gate until the request may be written, and returns
// the ticket to resolve. The timeout stands still meanwhile: the wait is
// not part of the attempt, however long. If the gate refuses, the reason
// is kept for classify and nothing may be written.
func (a *attempt) passGate() (*Ticket, error) {
	a.timeout.standStill()
	defer a.timeout.run()
	ticket, err := a.waitAtGate()
	if err != nil {
		a.refuse(err)
	}
	return ticket, err
}

// waitAtGate waits for the job's slot and its lanes (its tenant's rate and
// windows, its downstream's ceiling, their holds), then for the shared gate
// if there is one. It gives up when a lane is held, the deadline passes
// first, or the service stops.
func (a *attempt) waitAtGate() (*Ticket, error) {
	d, job := a.d, a.job
	ticket, err := d.gate.WaitLanes(a.gateCtx, job.DispatchAt, a.lanes...)
	if err != nil {
		return nil, err
	}
	if !job.Deadline.IsZero() && ticket.At.After(job.Deadline) {
		ticket.Done()
		return nil, errExpired
	}
	var grant *remoteGrant
	if a.remote != nil {
		g, err := passRemote(a.gateCtx, d.clock, a.remote, job.Deadline)
		if err != nil {
			ticket.Done()
			return nil, err
		}
		grant = g
	}
	if !queue.MaySend(a.stop) { // asked last: a frozen process wakes up to this
		ticket.Done()
		grant.resolve(a.ctx, time.Time{})
		return nil, errNotOurs
	}
	a.mu.Lock()
	a.grant = grant
	a.mu.Unlock()
	return ticket, nil
}

// refuse keeps why the gate let nothing be written: a held lane, the
// deadline, or the service stopping (the wait was cut short). Any other
// error is not the gate's refusal, and classify sees it as what it is.
func (a *attempt) refuse(err error) {
	var held *HeldError
	switch {
	case errors.As(err, &held), errors.Is(err, errExpired), errors.Is(err, errNotOurs):
	case a.stop.Err() != nil && a.gateCtx.Err() != nil:
		err = errStopped
	default:
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refused == nil {
		a.refused = err
	}
}

// wrote records when the request was written.
func (a *attempt) wrote(at time.Time) {
	a.mu.Lock()
	if !a.over {
		a.sentAt = at
	}
	a.grant.resolve(a.ctx, at)
	a.mu.Unlock()
	if a.d.onWrite != nil {
		a.d.onWrite(a.job)
	}
}

// send signs the request, sends it and reads the answer, all within the
// timeout but for the wait at the gate.
func (a *attempt) send(req *http.Request, body []byte) sent {
	// Signed as late as it can be: the wait at the gate happens inside the
	// connection's first Write, after the headers are serialized, so the
	// timestamp is the later of now and the job's dispatch time (the slot
	// the gate waits for), not the time it was handed over, a lead before.
	a.out.Sign(req.Header, a.job.ID, body, clock.Later(a.d.clock.Now(), a.job.DispatchAt))
	resp, err := roundTrip(a.client, req)
	var ans *answer
	if err == nil {
		a.mu.Lock()
		pw := a.paced
		a.mu.Unlock()
		if pw != nil {
			<-pw.done // an answer means the write was made: wait until it is told
		}
		ans = a.read(resp)
	}
	timedOut := a.timeout.end()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.over = true
	return sent{at: a.sentAt, answer: ans, err: err, refused: a.refused, timedOut: timedOut}
}

// read reads the answer: at most MaxResponseBytes of its body, or
// keep_response_bytes if more (and one byte beyond, to know whether it was
// cut short), and what the job keeps of it.
func (a *attempt) read(resp *http.Response) *answer {
	limit := max(MaxResponseBytes, a.out.Config().KeepBytes())
	body, _ := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	resp.Body.Close()
	truncated := len(body) > limit
	if truncated {
		body = body[:limit]
	}
	wait, exhausted := exhausted(resp.Header, a.route.Announce, a.d.clock.Now())
	return &answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: body,
		exhausted: exhausted, wait: wait, kept: a.out.Keep(resp.StatusCode, resp.Header, body, truncated)}
}

// roundTrip sends req as client.Do would, straight to the client's
// transport when Do would add nothing: the clients of NewClient follow no
// redirect (CheckRedirect answers http.ErrUseLastResponse), keep no
// cookies and set no timeout of their own, and a downstream's URL carries
// no password. Do clones every request's headers for the redirects it
// would follow, and a vendor's eleven headers make that the larger part
// of what it costs over a plain JSON request (docs/BENCHMARKS.md,
// BenchmarkVendorRequest). Errors are wrapped as Do wraps them.
func roundTrip(cl *http.Client, req *http.Request) (*http.Response, error) {
	if cl.Jar != nil || cl.Timeout != 0 || cl.CheckRedirect == nil || req.URL.User != nil ||
		!errors.Is(cl.CheckRedirect(req, nil), http.ErrUseLastResponse) {
		return cl.Do(req)
	}
	tr := cl.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, &url.Error{Op: req.Method[:1] + strings.ToLower(req.Method[1:]), URL: req.URL.Redacted(), Err: err}
	}
	return resp, nil
}
