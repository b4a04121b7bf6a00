// Package api owns the HTTP API: its routes, auth, request validation, JSON
// shapes, and the one place where store errors become status codes (fail,
// in errors.go).
//
// Files by topic: api.go (options, routes, health), enqueue.go (jobs in:
// single and batch), jobs.go (one job: read, cancel, retry; failed jobs),
// tenants.go (tenant status, listing, holds), shapes.go (JSON answers),
// errors.go (error answers), ratelimit.go (the RateLimit fields of
// admission answers), openapi.go (the OpenAPI document, openapi.json),
// auth.go, page.go (the status page).
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/metrics"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/policies"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Options configure the API.
type Options struct {
	Store queue.Store
	// Config gives the current config (it may be reloaded).
	Config func() *config.Config
	// Ready reports whether the service takes work (nil: ready). /readyz also
	// pings the store.
	Ready  func() error
	Logger *slog.Logger
	// Metrics, if set, counts admissions and serves /metrics.
	Metrics *metrics.Metrics
	// Clock turns expires_in into a deadline; the store's clock. Default
	// clock.Real.
	Clock clock.Clock
	// WorkerOnly: the process sends jobs and serves only /healthz,
	// /readyz and /metrics (throttler serve --role worker).
	WorkerOnly bool
	// Outbound gives a downstream's compiled request rules by name, as the
	// current config has them (it may be reloaded): admission checks a
	// job's payload and request against them, so that a job that could
	// never be sent is refused (422) before it is queued. Nil: no checks.
	Outbound func(downstream string) *outbound.Downstream
	// HandlesType reports whether the Go handler named handler takes a
	// job of downstream with type typ, as this process knows its handlers:
	// admission refuses a job no handler can ever take (422 unknown_type).
	// Nil: types are not checked.
	HandlesType func(handler, downstream, typ string) bool
	// Policies sets and drops tenants' policies (PUT and DELETE
	// /v1/tenants/{t}/policy). Default: kept in Store (which keeps them:
	// queue.Policies) and put in force in Config.
	Policies PolicyEditor
}

type server struct {
	store   queue.Store
	config  func() *config.Config
	ready   func() error
	log     *slog.Logger
	slots   chan struct{} // requests being handled
	clients clientSlots   // each client's requests open (guard.go)
	waiters chan struct{} // GET /v1/jobs/{id}?wait requests waiting (jobs.go)
	metrics *metrics.Metrics
	clock   clock.Clock
	memos   memos // what the RateLimit fields need beyond the store's answers
	// outbound gives a downstream's request rules (nil: none checked).
	outbound func(downstream string) *outbound.Downstream
	// handlesType is Options.HandlesType (nil: none checked).
	handlesType func(handler, downstream, typ string) bool
	policies    PolicyEditor // Options.Policies
}

// MaxBatchJobs is the most jobs one jobs:batch request may carry.
const MaxBatchJobs = 1000

// envelopeBytes is room for the JSON around a payload (key, options).
const envelopeBytes = 64 << 10

// New returns the API's handler.
func New(opts Options) http.Handler {
	s := &server{store: opts.Store, config: opts.Config, ready: opts.Ready, log: opts.Logger,
		slots:   make(chan struct{}, opts.Config().Server.MaxConcurrentRequests),
		waiters: make(chan struct{}, waitersPerSlot*opts.Config().Server.MaxConcurrentRequests), metrics: opts.Metrics,
		clock: cmp.Or[clock.Clock](opts.Clock, clock.Real{}), outbound: opts.Outbound, handlesType: opts.HandlesType, policies: opts.Policies}
	if s.log == nil {
		s.log = slog.Default()
	}
	if kept, ok := opts.Store.(queue.Policies); ok && s.policies == nil {
		s.policies = policies.New(policies.Options{Store: kept, Live: opts.Config, Logger: s.log})
	}
	if s.ready == nil {
		s.ready = func() error { return nil }
	}
	mux := http.NewServeMux()
	rt := newRoutes(mux)
	if opts.WorkerOnly {
		mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "worker_only", "this process runs with --role worker: it sends jobs and serves /healthz, /readyz and /metrics; send API requests to a process with --role api or all", nil)
		})
	} else {
		s.routes(rt)
	}
	rt.handle("GET", "/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	rt.handle("GET", "/readyz", s.readyz)
	if s.metrics != nil {
		prom := promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{})
		rt.handle("GET", "/metrics", func(w http.ResponseWriter, r *http.Request) {
			// Metrics show every tenant: a token scoped to some may not see them.
			if t := principal(r); t != nil && !t.AllTenants() {
				s.fail(w, r, errorf(http.StatusForbidden, "forbidden", "token %q is scoped to some tenants; /metrics needs a token for all (\"*\")", t.Name))
				return
			}
			prom.ServeHTTP(w, r)
		})
	}
	rt.otherMethods()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.URL.Path+"; the API lives under /v1/ (see docs/api.md)", nil)
	})
	return s.authenticate(s.limit(tenantPaths(mux)))
}

// routes adds the API's own routes (all but health and metrics).
func (s *server) routes(rt *routes) {
	rt.handle("POST", "/v1/tenants/{tenant}/jobs", s.enqueue)
	rt.handle("POST", "/v1/tenants/{tenant}/jobs:batch", s.enqueueBatch)
	rt.handle("GET", "/v1/tenants/{tenant}", s.tenant)
	rt.handle("GET", "/v1/tenants", s.tenants)
	rt.handle("GET", "/v1/jobs/{id}", s.job)
	rt.handle("DELETE", "/v1/jobs/{id}", s.cancel)
	rt.handle("POST", "/v1/jobs/{id}/retry", s.retry)
	rt.handle("GET", "/v1/tenants/{tenant}/jobs", s.failedJobs)
	rt.handle("POST", "/v1/tenants/{tenant}/pause", s.hold(true))
	rt.handle("POST", "/v1/tenants/{tenant}/resume", s.hold(false))
	rt.handle("GET", "/v1/tenants/{tenant}/policy", s.policy)
	rt.handle("PUT", "/v1/tenants/{tenant}/policy", s.setPolicy)
	rt.handle("DELETE", "/v1/tenants/{tenant}/policy", s.dropPolicy)
	s.statusRoutes(rt) // overview.go: whoami, downstreams, history
	rt.handle("GET", "/openapi.json", s.openAPIDocument)
	rt.handle("GET", "/{$}", s.page)
	rt.handle("GET", "/static/app.js", s.pageScript)
}

// routes registers handlers by method and path, and keeps, by path, the
// methods it has, so that any other method on a known path is answered 405
// with an Allow header naming them (RFC 9110, 15.5.6), in JSON like every
// error, instead of the mux's text or a 404 that says the path does not
// exist.
type routes struct {
	mux   *http.ServeMux
	allow map[string][]string // pattern -> methods
	order []string            // patterns, as first added
}

func newRoutes(mux *http.ServeMux) *routes {
	return &routes{mux: mux, allow: map[string][]string{}}
}

// handle routes method on pattern to h. A GET route answers HEAD too (the
// mux's rule), so HEAD is allowed with it.
func (rt *routes) handle(method, pattern string, h http.HandlerFunc) {
	rt.mux.HandleFunc(method+" "+pattern, h)
	if _, ok := rt.allow[pattern]; !ok {
		rt.order = append(rt.order, pattern)
	}
	rt.allow[pattern] = append(rt.allow[pattern], method)
	if method == http.MethodGet {
		rt.allow[pattern] = append(rt.allow[pattern], http.MethodHead)
	}
}

// otherMethods answers every method not routed on a known path: 405.
func (rt *routes) otherMethods() {
	for _, p := range rt.order {
		allow := strings.Join(slices.Sorted(slices.Values(rt.allow[p])), ", ")
		rt.mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s: it takes %s", r.Method, r.URL.Path, allow), nil)
		})
	}
}

func (s *server) counted(tenant string, out []queue.Admission) {
	if s.metrics != nil {
		s.metrics.Admitted(tenant, out)
	}
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.ready(); err != nil {
		writeError(w, http.StatusServiceUnavailable, "not_ready", err.Error(), nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		var full *queue.StoreFullError
		if errors.As(err, &full) { // reachable, but takes no new jobs: say why
			writeError(w, http.StatusServiceUnavailable, "store_full", full.Error(), storeFullFields(full))
			return
		}
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", err.Error(), nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
