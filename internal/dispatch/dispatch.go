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
}

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
}

// Dispatcher is a queue.Handler. Safe for concurrent use.
type Dispatcher struct {
	routes func(string) Route
	clock  clock.Clock
	client *http.Client
	gate   *Gate
	onAtt  func(queue.Job, queue.Outcome, string, time.Duration)

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
		rand:   rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
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

// attempt makes one attempt and classifies the answer.
func (d *Dispatcher) attempt(stop context.Context, job queue.Job) (queue.Outcome, string) {
	r := d.routes(job.Tenant)
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
		over     bool // the attempt's outcome is decided: a late report changes nothing
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
			pw := &pacedWrite{ctx: ctx, gate: d.gate, key: job.Tenant, policy: r.Policy, notBefore: job.DispatchAt, wrote: wrote, done: make(chan struct{})}
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
			t, err := d.gate.Wait(ctx, job.Tenant, r.Policy, job.DispatchAt)
			if err != nil {
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
	mu.Unlock()
	now := d.clock.Now()
	if err != nil {
		what, class := "connection error", "connection_error"
		if errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			what, class = fmt.Sprintf("timeout after %v", r.Timeout), "timeout"
		}
		if out.SentAt.IsZero() {
			class = "connection_error" // nothing was written
		}
		return d.retry(job, r, out, now, 0, fmt.Sprintf("%s: %v", what, unwrapURL(err))), class
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes))
	resp.Body.Close()
	out.Status = resp.StatusCode
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		out.Result = queue.Succeeded
		return out, "2xx"
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		wait, _ := retryAfter(resp.Header.Get("Retry-After"), now)
		class := "5xx"
		if s == http.StatusTooManyRequests {
			class = "429"
		}
		return d.retry(job, r, out, now, wait, statusError(s, body)), class
	case s >= 500 || s == http.StatusRequestTimeout:
		class := "5xx"
		if s < 500 {
			class = "4xx"
		}
		return d.retry(job, r, out, now, 0, statusError(s, body)), class
	case s >= 300 && s < 400:
		out.Result = queue.Failed
		out.Error = statusError(s, body) + " (redirects are not followed: point the downstream url at the final address)"
		return out, "3xx"
	default:
		out.Result = queue.Failed
		out.Error = statusError(s, body)
		return out, "4xx"
	}
}

// retry schedules another attempt no earlier than wait from now (backoff if
// wait is 0), or fails the job once its attempts are used up.
func (d *Dispatcher) retry(job queue.Job, r Route, out queue.Outcome, now time.Time, wait time.Duration, msg string) queue.Outcome {
	out.Error = msg
	if job.Attempts >= r.MaxAttempts {
		out.Result = queue.Failed
		out.Error = fmt.Sprintf("gave up after %d attempts: %s", job.Attempts, msg)
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
