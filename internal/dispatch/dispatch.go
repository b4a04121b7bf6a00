// Package dispatch sends due jobs to their downstream: it waits for the
// job's slot, passes the tenant's gate at the moment the request is written,
// calls the downstream, and classifies the answer (succeeded, retry, failed).
package dispatch

import (
	"cmp"
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Route is where and how a tenant's jobs go.
type Route struct {
	Downstream string
	// Outbound builds, signs and keeps the answers of the downstream's
	// requests (its config as last compiled: a reload swaps it). Nil: a
	// POST of the payload as JSON to URL, throttler's headers only.
	Outbound *outbound.Downstream
	// URL is where requests go when Outbound is nil.
	URL string
	// Timeout bounds an attempt's connection setup, write and answer; never
	// its wait at the gate (for its slot, its rate, a window, a ceiling),
	// however long.
	Timeout     time.Duration
	MaxAttempts int
	Policy      leaky.Policy
	// Ceiling is the downstream's own limit across its tenants (nil: none).
	Ceiling *leaky.Policy
	// Call, if set, is the Go handler the downstream is (config's
	// handler): attempts call it in-process instead of sending a request
	// (handler.go). Outbound then checks nothing at the send, and keeps
	// what the handler returns.
	Call Call
	// Announce is the style of rate limit fields its answers carry
	// (AnnounceIETF, AnnounceXRate; "" or AnnounceOff: none read);
	// AnnounceDownstream, that a "none left" holds every tenant of the
	// downstream, not only the one whose answer said so; MaxHold, the
	// longest hold one may ask for.
	Announce           string
	AnnounceDownstream bool
	MaxHold            time.Duration
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
	// Client sends requests to downstreams with the system's TLS
	// defaults; a downstream with TLS settings of its own gets a copy of
	// its *http.Transport with them (see clients). Default NewClient(1024).
	Client *http.Client
	// OnAttempt, if set, is told of every attempt: its outcome, the answer's
	// class (2xx, 3xx, 4xx, 429, 5xx, timeout, connection_error; "" if
	// nothing was sent) and the time from write to answer.
	OnAttempt func(job queue.Job, o queue.Outcome, class string, latency time.Duration)
	// Shared, if set, is the gate of a store many processes share (Redis):
	// every send passes it too, right before it is written.
	Shared func(ctx context.Context, r queue.GateRequest) (queue.GateAnswer, error)
	// OnWrite, if set, is told when an attempt's request is written (a
	// Go handler's: called), before its answer. It must be quick.
	OnWrite func(job queue.Job)
	// OnAnnounced, if set, is told when an answer's rate limit fields
	// hold job's tenant (and its downstream, with a ceiling) for wait;
	// capped: the reset was further away than the route's bound, which
	// is what is held.
	OnAnnounced func(job queue.Job, wait time.Duration, capped bool)
}

// Dispatcher is a queue.Handler. Safe for concurrent use.
type Dispatcher struct {
	routes  func(string) Route
	clock   clock.Clock
	clients *clients
	gate    *Gate
	// plain are the Outbound of routes that have none, by URL.
	plain sync.Map
	// onAttempt is Options.OnAttempt; shared, Options.Shared; onWrite,
	// Options.OnWrite.
	onAttempt func(queue.Job, queue.Outcome, string, time.Duration)
	shared    func(context.Context, queue.GateRequest) (queue.GateAnswer, error)
	onWrite   func(queue.Job)
	announced func(queue.Job, time.Duration, bool)

	breakersMu sync.Mutex
	breakers   map[string]*breaker // by downstream

	randMu sync.Mutex
	rand   *rand.Rand
}

// New returns a Dispatcher.
func New(opts Options) *Dispatcher {
	clk := cmp.Or[clock.Clock](opts.Clock, clock.Real{})
	return &Dispatcher{
		routes:    opts.Routes,
		clock:     clk,
		clients:   newClients(cmp.Or(opts.Client, NewClient(1024))),
		gate:      NewGate(clk),
		onAttempt: opts.OnAttempt,
		shared:    opts.Shared,
		onWrite:   opts.OnWrite,
		announced: opts.OnAnnounced,

		breakers: map[string]*breaker{},
		rand:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// MaxResponseBytes is how much of a response body is read (or the
// downstream's keep_response_bytes, if more): enough for an error excerpt,
// the answer kept and to reuse the connection, never a downstream's whole
// 1 GB.
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
			ResponseHeaderTimeout: 0, // the attempt's timeout covers it
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Handle sends one job: it implements queue.Handler. A stop cuts short a
// wait at the gate (the job is Released, nothing sent), never a request
// being written or answered.
func (d *Dispatcher) Handle(stop context.Context, job queue.Job) queue.Outcome {
	if stop.Err() != nil {
		return queue.Outcome{Result: queue.Released}
	}
	o, class := d.attempt(stop, job)
	if d.onAttempt != nil {
		var latency time.Duration
		if !o.SentAt.IsZero() {
			latency = d.clock.Now().Sub(o.SentAt)
		}
		d.onAttempt(job, o, class, latency)
	}
	return o
}

// outbound is r's Outbound, or for a route without one, a POST of the
// payload as JSON to r.URL (compiled once per URL).
func (d *Dispatcher) outbound(r Route) (*outbound.Downstream, error) {
	if r.Outbound != nil {
		return r.Outbound, nil
	}
	if o, ok := d.plain.Load(r.URL); ok {
		return o.(*outbound.Downstream), nil
	}
	o, err := outbound.Compile(cmp.Or(r.Downstream, "default"), config.Downstream{URL: r.URL})
	if err != nil {
		return nil, err
	}
	d.plain.Store(r.URL, o)
	return o, nil
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
