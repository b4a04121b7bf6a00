// Package service owns one throttler process's life: it wires the store,
// the metrics, the dispatcher and the HTTP API together for a role (all,
// api, worker), takes config reloads, and stops cleanly.
package service

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/throttler-dev/throttler/internal/api"
	"github.com/throttler-dev/throttler/internal/callback"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/dispatch"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/metrics"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/policies"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
	"github.com/throttler-dev/throttler/internal/queue/redis"
)

// Options configure Run.
type Options struct {
	Config *config.Config
	Logger *slog.Logger
	// Started, if set, is told the address the API listens on.
	Started func(addr string)
	// Reloads brings new configs (SIGHUP): tenants, tenant defaults and
	// downstreams change at once; other sections need a restart and are
	// kept as they were (with a log line saying so).
	Reloads <-chan *config.Config
	// Role is what this process does: RoleAll (default), RoleAPI or
	// RoleWorker (the last two need a store processes share: redis).
	Role string
	// Handlers are the Go handlers this process can call, by the name a
	// downstream's handler key gives (DESIGN.md section 6d; the public
	// handler package fills it). A process that sends (RoleAll,
	// RoleWorker) refuses to start, and a reload, when the config names
	// a handler it does not have (handlers.go).
	Handlers map[string]dispatch.Call
	// Types tell, by handler name, whether a handler takes a job of a
	// downstream and type (handler.Typed); a handler not named takes every
	// type. The API refuses a job of a type its handler does not take (422
	// unknown_type) where this process has the handler.
	Types map[string]func(downstream, typ string) bool
	// RedisTesting is for tests only; production leaves it nil (no config
	// setting, flag or environment variable reaches it). It is the Redis
	// store's redis.Options.Testing: a process test runs a worker whose
	// clock is off, as no test can move the machine's.
	RedisTesting *redis.TestHooks
}

// Roles of a process.
const (
	RoleAll    = "all"    // the API and the dispatcher
	RoleAPI    = "api"    // the API only: admits jobs, sends none
	RoleWorker = "worker" // the dispatcher only; serves /healthz, /readyz and /metrics
)

// Run runs until ctx is done, then stops cleanly: readiness goes false, the
// listener closes after server.drain_delay, the API finishes its requests,
// attempts being written finish (within server.shutdown_timeout) and their
// outcome is recorded.
func Run(ctx context.Context, opts Options) error {
	role, err := checkRole(opts.Role, opts.Config)
	if err != nil {
		return err
	}
	r := &running{cfg: opts.Config, log: opts.Logger, role: role, handlers: opts.Handlers, types: opts.Types, redisTesting: opts.RedisTesting}
	if err := r.checkHandlers(opts.Config); err != nil {
		return err
	}
	// Secrets and TLS files are read now: one that cannot be is refused
	// before anything starts, naming its key.
	out, err := compileOutbound(opts.Config)
	if err != nil {
		return err
	}
	r.out.Store(out)
	r.live.Store(opts.Config)
	if err := r.openStore(ctx); err != nil {
		return err
	}
	r.policies = policies.New(policies.Options{Store: r.store.(queue.Policies), Live: r.live.Load, Changed: r.policiesChanged,
		Counted: r.metrics.PolicyChanged, Logger: r.log})
	if err := r.policies.Start(ctx); err != nil {
		r.store.Close()
		return err
	}
	r.startDispatcher()
	r.keepRecent(ctx)
	defer r.dispatcher.CloseIdleConnections()
	ln, err := r.listen()
	if err != nil {
		r.stopRecent()
		r.policies.Stop()
		r.store.Close()
		return err
	}
	r.serve(ln)
	r.consume()
	r.startCallbacks()
	r.announce(ln, opts.Started)
	runErr := r.wait(ctx, opts.Reloads)
	r.stop()
	return runErr
}

// running is one throttler process between Run's start and its return.
type running struct {
	cfg  *config.Config // the sections a running service cannot change
	log  *slog.Logger
	role string
	// live is the config as reloaded: tenants, tenant defaults, downstreams.
	live atomic.Pointer[config.Config]
	// out is live with its downstreams compiled (secrets and TLS files
	// read), swapped with it at a reload: one snapshot, so a send never
	// pairs one config's tenant with another's downstream.
	out atomic.Pointer[outboundSet]

	handlers     map[string]dispatch.Call                     // Options.Handlers
	types        map[string]func(downstream, typ string) bool // Options.Types
	redisTesting *redis.TestHooks                             // Options.RedisTesting

	store      queue.Store
	metrics    *metrics.Metrics // made once the store is open; used from the dispatcher on
	recent     *metrics.Recent  // the last minutes, for the status page (nil: --role worker)
	dispatcher *dispatch.Dispatcher
	callbacks  *callback.Sender // nil: this process sends none (--role api)
	srv        *http.Server

	stopping, dispatcherDown atomic.Bool
	serveErr                 chan error // the HTTP server's end
	consumeDone              chan error // the dispatcher's end (closed at once for --role api)
	stopConsume              context.CancelFunc
	policies                 *policies.Keeper // tenants' policies set by the API
}

// checkRole is the process's role (default RoleAll), if the store allows it.
func checkRole(role string, cfg *config.Config) (string, error) {
	role = cmp.Or(role, RoleAll)
	switch {
	case role != RoleAll && role != RoleAPI && role != RoleWorker:
		return "", fmt.Errorf("--role %q is not a role: use all, api or worker", role)
	case role != RoleAll && cfg.Store.Backend != "redis":
		return "", fmt.Errorf("--role %s needs a store that processes share (store.backend = \"redis\"); the embedded store runs one process, --role all", role)
	}
	return role, nil
}

// openStore opens the store and the metrics that read it at scrape time.
func (r *running) openStore(ctx context.Context) error {
	cfg, log, live := r.cfg, r.log, &r.live
	store, err := openStore(ctx, cfg, log, live, func(j queue.Job) { r.metrics.Expired(j) }, r.redisTesting)
	if err != nil {
		return err
	}
	r.store = store
	r.metrics = metrics.New(store, r.metricLabels, r.namedTenants)
	return nil
}

// metricLabels labels a tenant by its downstream, and by its name only if
// config names it (metrics.OtherTenants otherwise).
func (r *running) metricLabels(tenant string) (string, string) {
	c := r.live.Load()
	ts, _ := c.Tenant(tenant)
	if _, named := c.Tenants[tenant]; named {
		return ts.Downstream, tenant
	}
	return ts.Downstream, metrics.OtherTenants
}

func (r *running) namedTenants() []string {
	c := r.live.Load()
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	return names
}

// startDispatcher makes the dispatcher (it sends only once consume starts).
func (r *running) startDispatcher() {
	store, m := r.store, r.metrics
	var shared func(context.Context, queue.GateRequest) (queue.GateAnswer, error)
	if g, ok := store.(queue.SharedGate); ok {
		shared = g.PassGate
	}
	var onWrite func(queue.Job)
	if w, ok := store.(queue.WriteNoter); ok {
		onWrite = w.Wrote
	}
	r.dispatcher = dispatch.New(dispatch.Options{
		Clock:     store.Clock(),
		Shared:    shared,
		Client:    dispatch.NewClient(r.cfg.Dispatch.Concurrency),
		OnAttempt: m.Attempt,
		OnWrite:   onWrite,
		Routes:    r.route,
		OnAnnounced: func(j queue.Job, wait time.Duration, capped bool) {
			m.Announced(j)
			if capped {
				r.log.Warn("a downstream announced no room left until a reset further away than its max_hold: holding that long only",
					"tenant", j.Tenant, "held_for", wait.String())
			}
		},
	})
	m.WatchBreakers(r.dispatcher.Breakers)
}

// route is where a tenant's jobs go, by the live config.
func (r *running) route(tenant string) dispatch.Route {
	set := r.out.Load()
	c := set.cfg
	ts, _ := c.Tenant(tenant)
	ds := c.Downstreams[ts.Downstream]
	return dispatch.Route{Downstream: ts.Downstream, Outbound: set.byName[ts.Downstream], URL: ds.URL, Timeout: ds.Timeout.Std(),
		MaxAttempts: c.Attempts(ts), Policy: ts.Policy(), Ceiling: ds.Ceiling(), Call: r.call(ds),
		Announce: ds.RateLimitHeaders, AnnounceDownstream: ds.RateLimitScope == "downstream", MaxHold: ds.MaxHold.Std()}
}

// keepRecent starts the samples of the last minutes that the status page
// draws (a process that serves the API: not --role worker).
func (r *running) keepRecent(ctx context.Context) {
	if r.role != RoleWorker {
		r.recent = r.metrics.KeepRecent(context.WithoutCancel(ctx), metrics.RecentOptions{})
	}
}

func (r *running) stopRecent() {
	if r.recent != nil {
		r.recent.Stop()
	}
}

// listen opens the API's listener and makes its server.
func (r *running) listen() (net.Listener, error) {
	cfg := r.cfg
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another throttler running? change server.listen)", cfg.Server.Listen, err)
	}
	r.srv = &http.Server{
		Handler: api.New(api.Options{
			Store:      holdingStore{r.store, r.dispatcher},
			WorkerOnly: r.role == RoleWorker,
			Config:     r.live.Load,
			Outbound:   r.outbound,
			HandlesType: func(handler, downstream, typ string) bool {
				f := r.types[handler]
				return f == nil || f(downstream, typ)
			},
			Logger:   r.log,
			Metrics:  r.metrics,
			Ready:    r.ready,
			Policies: r.policies,
		}),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.Std(),
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(r.log.Handler(), slog.LevelWarn),
	}
	return ln, nil
}

// ready is /readyz beyond the store's ping: false while stopping, or once
// the dispatcher has stopped by itself.
func (r *running) ready() error {
	switch {
	case r.stopping.Load():
		return errors.New("shutting down")
	case r.dispatcherDown.Load():
		return errors.New("the dispatcher stopped")
	}
	return nil
}

// serve serves the API on ln until the server is shut down.
func (r *running) serve(ln net.Listener) {
	cfg := r.cfg
	r.serveErr = make(chan error, 1)
	go func() {
		if cfg.Server.TLSCert != "" {
			r.serveErr <- r.srv.ServeTLS(ln, cfg.Server.TLSCert, cfg.Server.TLSKey)
			return
		}
		r.serveErr <- r.srv.Serve(ln)
	}()
	if len(cfg.Auth.Tokens) == 0 && cfg.Auth.InsecureNoAuth {
		r.log.Warn("NO AUTH: the API takes requests from anyone who can reach " + ln.Addr().String() + " (--insecure-no-auth); add [[auth.tokens]] unless this network is fully trusted")
	}
}

// consume hands due jobs to the dispatcher until stop; a dispatcher that
// stops by itself makes the process unready.
func (r *running) consume() {
	consumeCtx, stopConsume := context.WithCancel(context.Background())
	r.stopConsume = stopConsume
	r.consumeDone = make(chan error, 1)
	if r.role == RoleAPI {
		close(r.consumeDone) // admits only: processes with --role worker or all send
		return
	}
	store, d, cfg := r.store, r.dispatcher, r.cfg
	go func() {
		err := store.Consume(consumeCtx, d.Handle, queue.ConsumeOptions{Concurrency: cfg.Dispatch.Concurrency})
		if consumeCtx.Err() == nil {
			r.dispatcherDown.Store(true)
			r.log.Error("the dispatcher stopped", "err", err)
		}
		r.consumeDone <- err
	}()
}

// startCallbacks starts sending the callbacks jobs' ends owe (DESIGN.md
// 6b), in a process that sends (not --role api): with the store's clock,
// the live [callbacks] and its signer, and a client of its own.
func (r *running) startCallbacks() {
	if r.role == RoleAPI {
		return
	}
	r.callbacks = callback.New(callback.Options{
		Store: r.store, Clock: r.store.Clock(), Logger: r.log, OnAttempt: r.metrics.Callback,
		Live: func() (config.Callbacks, *outbound.Signer) {
			set := r.out.Load()
			return set.cfg.Callbacks, set.callbacks
		},
		Body: callbackBody,
	})
	r.callbacks.Start(context.Background())
}

// callbackBody is a callback's body (DESIGN.md 6b): the event's type and
// the job as GET /v1/jobs/{id} shows it.
func callbackBody(j queue.Job) ([]byte, error) {
	return json.Marshal(map[string]any{"type": "job." + string(j.State), "job": api.JobJSON(j)})
}

// announce logs the start and tells opts.Started where the API listens.
func (r *running) announce(ln net.Listener, started func(addr string)) {
	cfg := r.cfg
	r.log.Info("throttler started", "addr", ln.Addr().String(), "role", r.role, "store", cfg.Store.Backend, "path", cfg.Store.Path,
		"config", cfg.File, "tenants", len(cfg.Tenants), "downstreams", len(cfg.Downstreams),
		"tokens", len(cfg.Auth.Tokens), "tls", cfg.Server.TLSCert != "")
	if started != nil {
		started(ln.Addr().String())
	}
}

// wait takes reloads until ctx is done or the HTTP server fails.
func (r *running) wait(ctx context.Context, reloads <-chan *config.Config) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.serveErr:
			return fmt.Errorf("http server: %w", err)
		case next := <-reloads:
			r.reload(next)
		}
	}
}

// stop: readiness false first, then (after the drain delay) the listener,
// then the dispatcher, all within server.shutdown_timeout.
func (r *running) stop() {
	cfg, log := r.cfg, r.log
	r.stopping.Store(true)
	log.Info("stopping", "drain_delay", cfg.Server.DrainDelay.Std(), "shutdown_timeout", cfg.Server.ShutdownTimeout.Std())
	deadline, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.Std())
	defer cancel()
	select {
	case <-time.After(cfg.Server.DrainDelay.Std()):
	case <-deadline.Done():
	}
	if err := r.srv.Shutdown(deadline); err != nil {
		log.Warn("API requests still running at shutdown_timeout", "err", err)
	}
	r.stopConsume()
	if r.callbacks != nil {
		r.callbacks.Stop()
	}
	r.stopRecent()
	r.policies.Stop()
	select {
	case <-r.consumeDone:
		if err := r.store.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
		log.Info("stopped cleanly")
	case <-deadline.Done():
		// Closed all the same, so that nothing of the store outlives Run:
		// the attempts still in flight cannot record their outcome, and are
		// sent again (same Idempotency-Key) after a restart, which treats
		// this stop as a crash.
		log.Warn("attempts still in flight at shutdown_timeout: they will be sent again after restart")
		if err := r.store.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
	}
}

// reload takes a new config's tenants, tenant defaults and downstreams,
// its downstreams' secrets and TLS files read again; one that cannot be
// read refuses the whole reload and the running config is kept. The
// schedule of jobs already admitted stands; the next slots, and the spacing
// of every send from now on, follow the new settings.
func (r *running) reload(next *config.Config) {
	log, cur := r.log, r.live.Load()
	merged := *next
	out, err := compileOutbound(&merged)
	if err != nil {
		// The error names the key and the variable or file, never a value.
		log.Error("config reload refused; the running config is kept", "key", errorKey(err), "err", err)
		return
	}
	if err := r.checkHandlers(&merged); err != nil {
		log.Error("config reload refused; the running config is kept", "key", errorKey(err), "err", err)
		return
	}
	if keys := cur.NeedsRestart(next); len(keys) > 0 {
		log.Warn("config reloaded, but these sections need a restart and keep their running values", "sections", keys)
		merged.Server, merged.Store, merged.Dispatch, merged.Auth, merged.Log = cur.Server, cur.Store, cur.Dispatch, cur.Auth, cur.Log
	}
	err = r.policies.Adopt(&merged, cur, func() {
		r.out.Store(out)
		r.live.Store(&merged)
	})
	if err != nil {
		log.Error("config reload refused; the running config is kept", "err", err)
		return
	}
	r.dispatcher.UseTLS(out.all())
	log.Info("config reloaded", "config", next.File, "tenants", len(next.Tenants), "downstreams", len(next.Downstreams))
}

// policiesChanged tells the store the policies in force changed: those of
// tenants (nil: any tenant's, a reload), whose backlogs it places anew
// (queue.Repacer). A reload of the file moves no backlog: its jobs keep
// their slots, and the gate spaces them by the new policy.
func (r *running) policiesChanged(tenants []string) {
	if pl, ok := r.store.(queue.PolicyListener); ok {
		pl.PoliciesChanged()
	}
	rp, ok := r.store.(queue.Repacer)
	if !ok {
		return
	}
	for _, tenant := range tenants {
		if err := rp.Repace(context.Background(), tenant); err != nil {
			r.log.Warn("cannot re-pace a tenant's backlog for its new policy: its jobs keep their slots, and the gate spaces them by the new policy", "tenant", tenant, "err", err)
		}
	}
}

// holdingStore is the store as the API sees it: its Pause and Resume also
// hold and release the tenant in this process's dispatcher, so that an
// operator hold stops at once: the store stops handing the tenant's jobs
// over, and the dispatcher stops those it was handed just before (they wait
// at the gate for their slot).
type holdingStore struct {
	queue.Store
	d *dispatch.Dispatcher
}

func (h holdingStore) Pause(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	st, err := h.Store.Pause(ctx, tenant)
	if err == nil && !h.shared() {
		h.d.HoldTenant(tenant)
	}
	return st, err
}

func (h holdingStore) Resume(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	if !h.shared() {
		h.d.ResumeTenant(tenant)
	}
	return h.Store.Resume(ctx, tenant)
}

// shared reports a store many processes share: there the hold is in the
// shared gate, which every process sees (a hold kept in this process could
// be lifted by a resume that another process receives, and never would).
func (h holdingStore) shared() bool {
	_, ok := h.Store.(queue.SharedGate)
	return ok
}

// openStore opens the configured backend (redisTesting: Options.RedisTesting).
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger, live *atomic.Pointer[config.Config], onExpired func(queue.Job), redisTesting *redis.TestHooks) (queue.Store, error) {
	policy := func(tenant string) leaky.Policy {
		ts, _ := live.Load().Tenant(tenant)
		return ts.Policy()
	}
	ceiling := func(tenant string) (string, *leaky.Policy) {
		c := live.Load()
		ts, _ := c.Tenant(tenant)
		return ts.Downstream, c.Downstreams[ts.Downstream].Ceiling()
	}
	caps := func(tenant string) queue.Caps {
		c := live.Load()
		ts, _ := c.Tenant(tenant)
		ds := c.Downstreams[ts.Downstream]
		return queue.Caps{Downstream: ts.Downstream, Tenant: ts.InFlightCap(), Shared: ds.MaxInFlight, Timeout: ds.Timeout.Std()}
	}
	if cfg.Store.Backend != "redis" {
		return bolt.Open(cfg.Store.Path, bolt.Options{
			OnExpired: onExpired, Policy: policy, Ceiling: ceiling, Caps: caps,
			PoliciesRead: func(all map[string][]byte) error { return policies.Load(live.Load(), all) },
			Retention:    cfg.Store.Retention.Std(), Logger: log,
			Reserve: cmp.Or(int64(cfg.Store.Reserve), -1), // 0: not enforced
			// A first guess at how long a send takes to start, measured
			// from then on: a commit, a hand-over and a connection.
			InitialStartLag: 10 * time.Millisecond,
		})
	}
	rdb, err := cfg.Store.RedisClient()
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := redis.Open(pingCtx, redis.Options{
		Client: rdb, OwnsClient: true, Policy: policy, Ceiling: ceiling, Caps: caps, OnExpired: onExpired,
		Retention: cfg.Store.Retention.Std(), IdleTTL: cfg.Store.RedisIdleTTL.Std(), Logger: log,
		Partitions: cfg.Store.RedisPartitions, Timing: redis.Timing{Lease: cfg.Store.RedisLease.Std()},
		Testing: redisTesting,
	})
	if err != nil {
		rdb.Close()
		return nil, fmt.Errorf("cannot reach Redis at store.redis_url (%s mode): %w; is it running?", cfg.Store.RedisMode, err)
	}
	return s, nil
}
