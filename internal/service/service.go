// Package service wires a throttler together: the store, the dispatcher
// and the HTTP API, with a clean stop.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"throttler/internal/api"
	"throttler/internal/config"
	"throttler/internal/dispatch"
	"throttler/internal/leaky"
	"throttler/internal/metrics"
	"throttler/internal/queue"
	"throttler/internal/queue/bolt"
	"throttler/internal/queue/redis"
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
	log := opts.Logger
	var live atomic.Pointer[config.Config]
	live.Store(opts.Config)
	cfg := opts.Config // the sections a running service cannot change
	role := cmp.Or(opts.Role, RoleAll)
	switch {
	case role != RoleAll && role != RoleAPI && role != RoleWorker:
		return fmt.Errorf("--role %q is not a role: use all, api or worker", role)
	case role != RoleAll && cfg.Store.Backend != "redis":
		return fmt.Errorf("--role %s needs a store that processes share (store.backend = \"redis\"); the embedded store runs one process, --role all", role)
	}
	var m *metrics.Metrics // made once the store is open; used from the dispatcher on
	store, err := openStore(ctx, cfg, log, &live, func(j queue.Job) { m.Expired(j) })
	if err != nil {
		return err
	}
	m = metrics.New(store, func(tenant string) (string, string) {
		c := live.Load()
		ts, _ := c.Tenant(tenant)
		if _, named := c.Tenants[tenant]; named {
			return ts.Downstream, tenant
		}
		return ts.Downstream, metrics.OtherTenants
	}, func() []string {
		c := live.Load()
		names := make([]string, 0, len(c.Tenants))
		for name := range c.Tenants {
			names = append(names, name)
		}
		return names
	})
	client := dispatch.NewClient(cfg.Dispatch.Concurrency)
	defer client.CloseIdleConnections()
	var shared func(context.Context, queue.GateRequest) (queue.GateAnswer, error)
	if g, ok := store.(queue.SharedGate); ok {
		shared = g.PassGate
	}
	d := dispatch.New(dispatch.Options{
		Shared:    shared,
		Client:    client,
		OnAttempt: m.Attempt,
		Routes: func(tenant string) dispatch.Route {
			c := live.Load()
			ts, _ := c.Tenant(tenant)
			ds := c.Downstreams[ts.Downstream]
			return dispatch.Route{Downstream: ts.Downstream, URL: ds.URL, Timeout: ds.Timeout.Std(), MaxAttempts: c.Attempts(ts), Policy: ts.Policy(), Ceiling: ds.Ceiling()}
		},
	})
	m.WatchBreakers(d.Breakers)

	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		store.Close()
		return fmt.Errorf("listen on %s: %w (is another throttler running? change server.listen)", cfg.Server.Listen, err)
	}
	var stopping, dispatcherDown atomic.Bool
	srv := &http.Server{
		Handler: api.New(api.Options{
			Store:      holdsReachTheDispatcher{store, d},
			WorkerOnly: role == RoleWorker,
			Config:     live.Load,
			Logger:     log,
			Metrics:    m,
			Ready: func() error {
				switch {
				case stopping.Load():
					return errors.New("shutting down")
				case dispatcherDown.Load():
					return errors.New("the dispatcher stopped")
				}
				return nil
			},
		}),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.Std(),
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() {
		if cfg.Server.TLSCert != "" {
			serveErr <- srv.ServeTLS(ln, cfg.Server.TLSCert, cfg.Server.TLSKey)
			return
		}
		serveErr <- srv.Serve(ln)
	}()
	if len(cfg.Auth.Tokens) == 0 && cfg.Auth.InsecureNoAuth {
		log.Warn("NO AUTH: the API takes requests from anyone who can reach " + ln.Addr().String() + " (--insecure-no-auth); add [[auth.tokens]] unless this network is fully trusted")
	}

	consumeCtx, stopConsume := context.WithCancel(context.Background())
	consumeDone := make(chan error, 1)
	if role == RoleAPI {
		close(consumeDone) // admits only: processes with --role worker or all send
	} else {
		go func() {
			err := store.Consume(consumeCtx, d.Handle, queue.ConsumeOptions{Concurrency: cfg.Dispatch.Concurrency})
			if consumeCtx.Err() == nil {
				dispatcherDown.Store(true)
				log.Error("the dispatcher stopped", "err", err)
			}
			consumeDone <- err
		}()
	}
	log.Info("throttler started", "addr", ln.Addr().String(), "role", role, "store", cfg.Store.Backend, "path", cfg.Store.Path,
		"config", cfg.File, "tenants", len(cfg.Tenants), "downstreams", len(cfg.Downstreams),
		"tokens", len(cfg.Auth.Tokens), "tls", cfg.Server.TLSCert != "")
	if opts.Started != nil {
		opts.Started(ln.Addr().String())
	}

	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-serveErr:
			runErr = fmt.Errorf("http server: %w", err)
			break wait
		case next := <-opts.Reloads:
			reload(log, &live, next)
		}
	}

	// Stop: readiness false first, then (after the drain delay) the
	// listener, then the dispatcher.
	stopping.Store(true)
	log.Info("stopping", "drain_delay", cfg.Server.DrainDelay.Std(), "shutdown_timeout", cfg.Server.ShutdownTimeout.Std())
	deadline, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.Std())
	defer cancel()
	select {
	case <-time.After(cfg.Server.DrainDelay.Std()):
	case <-deadline.Done():
	}
	if err := srv.Shutdown(deadline); err != nil {
		log.Warn("API requests still running at shutdown_timeout", "err", err)
	}
	stopConsume()
	select {
	case <-consumeDone:
		if err := store.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
		log.Info("stopped cleanly")
	case <-deadline.Done():
		// Leaving the file unclosed is safe: bbolt recovers, and the jobs
		// still being sent are sent again (same Idempotency-Key) on restart.
		log.Warn("attempts still in flight at shutdown_timeout: they will be sent again after restart")
	}
	return runErr
}

// reload takes a new config's tenants, tenant defaults and downstreams. The
// schedule of jobs already admitted stands; the next slots, and the spacing
// of every send from now on, follow the new settings.
func reload(log *slog.Logger, live *atomic.Pointer[config.Config], next *config.Config) {
	cur := live.Load()
	merged := *next
	if keys := cur.NeedsRestart(next); len(keys) > 0 {
		log.Warn("config reloaded, but these sections need a restart and keep their running values", "sections", keys)
		merged.Server, merged.Store, merged.Dispatch, merged.Auth, merged.Log = cur.Server, cur.Store, cur.Dispatch, cur.Auth, cur.Log
	}
	live.Store(&merged)
	log.Info("config reloaded", "config", next.File, "tenants", len(next.Tenants), "downstreams", len(next.Downstreams))
}

// holdsReachTheDispatcher makes an operator hold stop at once: the store
// stops handing the tenant's jobs over, and the dispatcher stops those it
// was handed just before (they wait at the gate for their slot).
type holdsReachTheDispatcher struct {
	queue.Store
	d *dispatch.Dispatcher
}

func (h holdsReachTheDispatcher) Pause(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	st, err := h.Store.Pause(ctx, tenant)
	if err == nil && !h.shared() {
		h.d.HoldTenant(tenant)
	}
	return st, err
}

func (h holdsReachTheDispatcher) Resume(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	if !h.shared() {
		h.d.ResumeTenant(tenant)
	}
	return h.Store.Resume(ctx, tenant)
}

// shared reports a store many processes share: there the hold is in the
// shared gate, which every process sees (a hold kept in this process could
// be lifted by a resume that another process receives, and never would).
func (h holdsReachTheDispatcher) shared() bool {
	_, ok := h.Store.(queue.SharedGate)
	return ok
}

// openStore opens the configured backend.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger, live *atomic.Pointer[config.Config], onExpired func(queue.Job)) (queue.Store, error) {
	policy := func(tenant string) leaky.Policy {
		ts, _ := live.Load().Tenant(tenant)
		return ts.Policy()
	}
	ceiling := func(tenant string) (string, *leaky.Policy) {
		c := live.Load()
		ts, _ := c.Tenant(tenant)
		return ts.Downstream, c.Downstreams[ts.Downstream].Ceiling()
	}
	if cfg.Store.Backend != "redis" {
		return bolt.Open(cfg.Store.Path, bolt.Options{
			OnExpired: onExpired, Policy: policy, Ceiling: ceiling,
			Retention: cfg.Store.Retention.Std(), Logger: log,
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
		Client: rdb, OwnsClient: true, Policy: policy, Ceiling: ceiling, OnExpired: onExpired,
		Retention: cfg.Store.Retention.Std(), IdleTTL: cfg.Store.RedisIdleTTL.Std(), Logger: log,
	})
	if err != nil {
		rdb.Close()
		return nil, fmt.Errorf("cannot reach Redis at store.redis_url (%s mode): %w; is it running?", cfg.Store.RedisMode, err)
	}
	return s, nil
}
