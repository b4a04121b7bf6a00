// Package dispatch sends due jobs to their downstream: it waits for the
// job's slot, passes the tenant's gate at the moment the request is written,
// calls the downstream, and classifies the answer (succeeded, retry, failed).
package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// Route is where and how a tenant's jobs go.
type Route struct {
	Downstream  string
	URL         string
	Timeout     time.Duration
	MaxAttempts int
	Policy      leaky.Policy
	// Ceiling is the downstream's own limit across its tenants (nil: none).
	Ceiling *leaky.Policy
}

// lanes are the gate's rules for a send of tenant on r: the tenant's rate,
// and the downstream's ceiling (or, without one, its holds alone), for a
// job of cost.
func (r Route) lanes(tenant string, cost int) []Lane {
	ds := Lane{Key: downstreamKey(r.Downstream), Cost: cost}
	if r.Ceiling != nil {
		ds.Policy = *r.Ceiling
	}
	return []Lane{{Key: tenantKey(tenant), Policy: r.Policy, Cost: cost}, ds}
}

// The gate's keys: a tenant's lane and a downstream's.
func tenantKey(tenant string) string   { return "tenant:" + tenant }
func downstreamKey(name string) string { return "downstream:" + name }

// Options configure a Dispatcher.
type Options struct {
	// Routes gives each tenant's route. Required.
	Routes func(tenant string) Route
	// Clock paces sends. Default clock.Real.
	Clock clock.Clock
	// Client sends requests. Default NewClient(1024).
	Client *http.Client
	// OnAttempt, if set, is told of every attempt: its outcome, the answer's
	// class (2xx, 3xx, 4xx, 429, 5xx, timeout, connection_error; "" if
	// nothing was sent) and the time from write to answer.
	OnAttempt func(job queue.Job, o queue.Outcome, class string, latency time.Duration)
	// Shared, if set, is the gate of a store many processes share (Redis):
	// every send passes it too, right before it is written.
	Shared func(ctx context.Context, r queue.GateRequest) (queue.GateAnswer, error)
}

// Dispatcher is a queue.Handler. Safe for concurrent use.
type Dispatcher struct {
	routes func(string) Route
	clock  clock.Clock
	client *http.Client
	gate   *Gate
	onAtt  func(queue.Job, queue.Outcome, string, time.Duration)
	shared func(context.Context, queue.GateRequest) (queue.GateAnswer, error)

	breakersMu sync.Mutex
	breakers   map[string]*breaker // by downstream

	randMu sync.Mutex
	rand   *rand.Rand
}

// New returns a Dispatcher.
func New(opts Options) *Dispatcher {
	clk := cmp.Or[clock.Clock](opts.Clock, clock.Real{})
	return &Dispatcher{
		routes: opts.Routes,
		clock:  clk,
		client: cmp.Or(opts.Client, NewClient(1024)),
		gate:   NewGate(clk),
		onAtt:  opts.OnAttempt,
		shared: opts.Shared,

		breakers: map[string]*breaker{},
		rand:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// MaxResponseBytes is how much of a response body is read: enough for an
// error excerpt and to reuse the connection, never a downstream's whole 1 GB.
const MaxResponseBytes = 64 << 10

// NewClient returns the HTTP client for downstreams: HTTP/1.1 only (pacing
// needs to know when a request is written, which HTTP/2 multiplexing hides),
// redirects not followed, no response compression, and enough idle
// connections per host for maxConns attempts at once.
func NewClient(maxConns int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           pacedDialer(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}),
			MaxIdleConnsPerHost:   maxConns,
			IdleConnTimeout:       30 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			DisableCompression:    true,
			ForceAttemptHTTP2:     false,
			TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
			ResponseHeaderTimeout: 0, // the per-attempt timeout covers it
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Handle sends one job: it implements queue.Handler.
func (d *Dispatcher) Handle(stop context.Context, job queue.Job) queue.Outcome {
	if stop.Err() != nil {
		return queue.Outcome{Result: queue.Released}
	}
	o, class := d.attempt(stop, job)
	if d.onAtt != nil {
		var latency time.Duration
		if !o.SentAt.IsZero() {
			latency = d.clock.Now().Sub(o.SentAt)
		}
		d.onAtt(job, o, class, latency)
	}
	return o
}

func (d *Dispatcher) breaker(downstream string) *breaker {
	d.breakersMu.Lock()
	defer d.breakersMu.Unlock()
	b := d.breakers[downstream]
	if b == nil {
		b = &breaker{}
		d.breakers[downstream] = b
	}
	return b
}

// HoldTenant stops a tenant's sends that wait for their slot at the gate
// (an operator hold: the store has stopped handing its jobs over; these
// were handed over just before). They go back in line, unsent.
func (d *Dispatcher) HoldTenant(tenant string) {
	d.gate.Hold(tenantKey(tenant), clock.Never)
}

// ResumeTenant ends HoldTenant: the queue goes on one interval apart, not
// in a burst.
func (d *Dispatcher) ResumeTenant(tenant string) {
	key := tenantKey(tenant)
	d.gate.Unhold(key)
	d.gate.Space(key, d.clock.Now().Add(d.routes(tenant).Policy.Tolerance()))
}

// Breakers reports, by downstream, whether its circuit breaker stops its
// sends now.
func (d *Dispatcher) Breakers() map[string]bool {
	d.breakersMu.Lock()
	all := make(map[string]*breaker, len(d.breakers))
	for name, b := range d.breakers {
		all[name] = b
	}
	d.breakersMu.Unlock()
	out := make(map[string]bool, len(all))
	for name, b := range all {
		out[name] = b.isOpen()
	}
	return out
}

// attempt makes one attempt and classifies the answer.
func (d *Dispatcher) attempt(stop context.Context, job queue.Job) (queue.Outcome, string) {
	r := d.routes(job.Tenant)
	if !job.Deadline.IsZero() && d.clock.Now().After(job.Deadline) {
		return queue.Outcome{Result: queue.Expired}, ""
	}
	br := d.breaker(r.Downstream)
	// Asked as of the job's own time: a job handed over just before the
	// next probe is the probe.
	probe, until, ok := br.allow(clock.Later(d.clock.Now(), job.DispatchAt))
	if !ok {
		// The downstream is failing: this job waits for the next probe,
		// first in its tenant's queue, and uses up none of its attempts.
		return queue.Outcome{Result: queue.Released, PauseUntil: until}, ""
	}
	lanes := r.lanes(job.Tenant, job.Cost)
	var remote RemoteGate
	if d.shared != nil {
		req := queue.GateRequest{Downstream: r.Downstream, Tenant: job.Tenant, Policy: r.Policy, Ceiling: r.Ceiling, Cost: job.Cost, Slack: remoteSlack}
		remote = func(ctx context.Context) (queue.GateAnswer, error) { return d.shared(ctx, req) }
	}
	// Once begun, an attempt is not cut short by a stop: a request cut off
	// mid-write would leave the downstream guessing, and the job was handed
	// over only a moment before its slot.
	ctx, cancel := context.WithCancel(context.WithoutCancel(stop))
	defer cancel()
	// A bound on connecting: the slot is near, so this is generous.
	ctx, cancelDial := context.WithTimeout(ctx, job.DispatchAt.Sub(d.clock.Now())+r.Timeout+10*time.Second)
	defer cancelDial()

	var (
		mu       sync.Mutex
		sentAt   time.Time
		timeout  *time.Timer
		fallback *Ticket // pacing without a pacedConn
		armed    *pacedWrite
		held     *HeldError // the gate refused the send: a lane is held
		// lateForDeadline: the gate let it go only after its deadline, so
		// it was not sent
		lateForDeadline bool
		over            bool // the attempt's outcome is decided: a late report changes nothing
	)
	wrote := func(at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if over {
			return
		}
		sentAt = at
		if timeout == nil {
			timeout = time.AfterFunc(r.Timeout, cancel)
		}
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if fallback != nil {
			fallback.Done()
		}
	}()
	trace := &httptrace.ClientTrace{
		// GotConn runs once the connection is ready, before the request is
		// written (again after a dead idle connection: nothing was written
		// on that one). The gate itself is passed at the write.
		GotConn: func(info httptrace.GotConnInfo) {
			pw := &pacedWrite{ctx: ctx, gate: d.gate, lanes: lanes, notBefore: job.DispatchAt, deadline: job.Deadline, remote: remote, wrote: wrote, done: make(chan struct{})}
			if pace(info.Conn, pw) {
				mu.Lock()
				armed = pw
				mu.Unlock()
				return
			}
			// Not our connection type: pace here, and count the send as
			// lasting until the attempt ends.
			mu.Lock()
			if fallback != nil {
				fallback.Done()
			}
			mu.Unlock()
			t, err := d.gate.WaitLanes(ctx, job.DispatchAt, lanes...)
			if err == nil && remote != nil {
				if err = passRemote(ctx, remote); err != nil {
					t.Done()
				}
			}
			if err == nil && !job.Deadline.IsZero() && d.clock.Now().After(job.Deadline) {
				t.Done()
				err = errExpired
			}
			if err != nil {
				if errors.Is(err, errExpired) {
					mu.Lock()
					lateForDeadline = true
					mu.Unlock()
				}
				var h *HeldError
				if errors.As(err, &h) {
					mu.Lock()
					held = h
					mu.Unlock()
				}
				cancel() // nothing may be written
				return
			}
			mu.Lock()
			fallback = t
			mu.Unlock()
			wrote(t.At)
		},
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, r.URL, bytes.NewReader(job.Payload))
	if err != nil {
		return queue.Outcome{Result: queue.Failed, Error: fmt.Sprintf("cannot build the request to %s: %v", r.Downstream, err)}, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "throttler")
	req.Header.Set("Idempotency-Key", job.ID)
	req.Header.Set("X-Throttler-Tenant", job.Tenant)
	req.Header.Set("X-Throttler-Attempt", strconv.Itoa(job.Attempts))

	resp, err := d.client.Do(req)
	mu.Lock()
	pw := armed
	mu.Unlock()
	if err == nil && pw != nil {
		<-pw.done // an answer means the write was made: wait until it is told
	}
	mu.Lock()
	over = true
	if timeout != nil {
		timeout.Stop()
	}
	out := queue.Outcome{SentAt: sentAt}
	if pw != nil && held == nil {
		held = pw.refused.Load()
	}
	if pw != nil && pw.expired.Load() {
		lateForDeadline = true
	}
	mu.Unlock()
	now := d.clock.Now()
	if err != nil && lateForDeadline && out.SentAt.IsZero() {
		br.report(now, probe, unsent)
		return queue.Outcome{Result: queue.Expired}, ""
	}
	if err != nil && held != nil && out.SentAt.IsZero() {
		// Paused while it waited for its slot: nothing was sent. It goes
		// back in line behind the job that was pushed back.
		br.report(now, probe, unsent)
		if held.Busy {
			return queue.Outcome{Result: queue.Released, NotBefore: held.Until, Error: held.Error()}, ""
		}
		if !held.Until.Before(clock.Never) {
			return queue.Outcome{Result: queue.Released}, "" // the store holds the tenant
		}
		return queue.Outcome{Result: queue.Released, PauseUntil: held.Until}, ""
	}
	if err != nil {
		what, class := "connection error", "connection_error"
		if errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			what, class = fmt.Sprintf("timeout after %v", r.Timeout), "timeout"
		}
		if out.SentAt.IsZero() {
			class = "connection_error" // nothing was written
		}
		return d.failure(job, r, br, probe, out, now, fmt.Sprintf("%s: %v", what, unwrapURL(err))), class
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes))
	resp.Body.Close()
	out.Status = resp.StatusCode
	wait, hasWait := retryAfter(resp.Header.Get("Retry-After"), now)
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		br.report(now, probe, healthy)
		out.Result = queue.Succeeded
		return out, "2xx"
	case s == http.StatusTooManyRequests || (s == http.StatusServiceUnavailable && hasWait):
		br.report(now, probe, healthy) // it answers: it is up, and asks us to wait
		class := "5xx"
		if s == http.StatusTooManyRequests {
			class = "429"
		}
		if !hasWait {
			d.randMu.Lock()
			wait = backoff(job.Attempts, d.rand)
			d.randMu.Unlock()
		}
		return d.pushback(job, r, out, now.Add(wait), statusError(s, body)), class
	case s >= 500 || s == http.StatusRequestTimeout:
		class := "5xx"
		if s < 500 {
			class = "4xx"
		}
		return d.failure(job, r, br, probe, out, now, statusError(s, body)), class
	case s >= 300 && s < 400:
		br.report(now, probe, healthy)
		out.Result = queue.Failed
		out.Error = statusError(s, body) + " (redirects are not followed: point the downstream url at the final address)"
		return out, "3xx"
	default:
		br.report(now, probe, healthy)
		out.Result = queue.Failed
		out.Error = statusError(s, body)
		return out, "4xx"
	}
}

// pushback pauses the job's tenant until until (and the downstream, when it
// has a ceiling: its account-wide limit is what was hit): sends waiting at
// the gate give up and go back in line; the job keeps its place, first when
// the pause ends, and its attempts are not used up.
func (d *Dispatcher) pushback(job queue.Job, r Route, out queue.Outcome, until time.Time, msg string) queue.Outcome {
	// At least one interval: "Retry-After: 0" must not mean "again at once,
	// and again".
	until = clock.Later(until, d.clock.Now().Add(r.Policy.Interval))
	d.gate.Hold(tenantKey(job.Tenant), until)
	d.gate.Space(tenantKey(job.Tenant), until.Add(r.Policy.Tolerance()))
	if r.Ceiling != nil {
		d.gate.Hold(downstreamKey(r.Downstream), until)
		d.gate.Space(downstreamKey(r.Downstream), until.Add(r.Ceiling.Tolerance()))
	}
	out.Result, out.Error, out.NotBefore, out.PauseUntil = queue.Retry, msg, until, until
	out.PauseDownstream = r.Ceiling != nil
	return out
}

// failure handles a 5xx, timeout or connection error: it feeds the
// circuit breaker, and retries the job with backoff or fails it once its
// attempts are used up. A failed probe only waits for the next one.
func (d *Dispatcher) failure(job queue.Job, r Route, br *breaker, probe bool, out queue.Outcome, now time.Time, msg string) queue.Outcome {
	opened, probeAt := br.report(now, probe, failing)
	if opened {
		// Sends of other jobs waiting for their slot give up now.
		d.gate.Hold(downstreamKey(r.Downstream), probeAt)
	}
	if probe {
		out.Result, out.NotBefore, out.PauseUntil = queue.Retry, probeAt, probeAt
		out.Error = fmt.Sprintf("%s (circuit breaker open: next probe at %s)", msg, probeAt.UTC().Format(time.RFC3339))
		return out
	}
	return d.retry(job, r, out, now, 0, msg)
}

// retry schedules another attempt no earlier than wait from now (backoff if
// wait is 0), or fails the job once its attempts are used up.
func (d *Dispatcher) retry(job queue.Job, r Route, out queue.Outcome, now time.Time, wait time.Duration, msg string) queue.Outcome {
	out.Error = msg
	if job.Failures+1 >= r.MaxAttempts {
		out.Result = queue.Failed
		out.Error = fmt.Sprintf("gave up after %d failed attempts: %s", job.Failures+1, msg)
		return out
	}
	if wait == 0 {
		d.randMu.Lock()
		wait = backoff(job.Attempts, d.rand)
		d.randMu.Unlock()
	}
	out.Result = queue.Retry
	out.NotBefore = now.Add(wait)
	return out
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
