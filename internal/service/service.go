// Package service wires a throttler together: the store, the dispatcher
// and the HTTP API, with a clean stop.
package service

import (
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
)

// Run runs until ctx is done, then stops cleanly: readiness goes false, the
// API stops taking requests, attempts being written finish (within
// server.shutdown_timeout) and their outcome is recorded. started, if not
// nil, is told the address the API listens on.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, started func(addr string)) error {
	policy := func(tenant string) leaky.Policy {
		ts, _ := cfg.Tenant(tenant)
		return ts.Policy()
	}
	store, err := queue.OpenBolt(cfg.Store.Path, queue.BoltOptions{
		Policy: policy, Retention: cfg.Store.Retention.Std(), Logger: log,
		// A first guess at how long a send takes to start, measured from
		// then on: a commit, a hand-over and a connection.
		InitialStartLag: 10 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	m := metrics.New(store, func(tenant string) (string, string) {
		ts, _ := cfg.Tenant(tenant)
		if _, named := cfg.Tenants[tenant]; named {
			return ts.Downstream, tenant
		}
		return ts.Downstream, metrics.OtherTenants
	}, func() []string {
		names := make([]string, 0, len(cfg.Tenants))
		for name := range cfg.Tenants {
			names = append(names, name)
		}
		return names
	})
	client := dispatch.NewClient(cfg.Dispatch.Concurrency)
	defer client.CloseIdleConnections()
	d := dispatch.New(dispatch.Options{
		Client:    client,
		Logger:    log,
		OnAttempt: m.Attempt,
		Routes: func(tenant string) dispatch.Route {
			ts, _ := cfg.Tenant(tenant)
			ds := cfg.Downstreams[ts.Downstream]
			return dispatch.Route{Downstream: ts.Downstream, URL: ds.URL, Timeout: ds.Timeout.Std(), MaxAttempts: ds.MaxAttempts, Policy: ts.Policy()}
		},
	})

	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		store.Close()
		return fmt.Errorf("listen on %s: %w (is another throttler running? change server.listen)", cfg.Server.Listen, err)
	}
	var stopping atomic.Bool
	srv := &http.Server{
		Handler: api.New(api.Options{
			Store:   store,
			Config:  func() *config.Config { return cfg },
			Logger:  log,
			Metrics: m,
			Ready: func() error {
				if stopping.Load() {
					return errors.New("shutting down")
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
	go func() {
		consumeDone <- store.Consume(consumeCtx, d.Handle, queue.ConsumeOptions{Concurrency: cfg.Dispatch.Concurrency})
	}()
	log.Info("throttler started", "addr", ln.Addr().String(), "store", cfg.Store.Backend, "path", cfg.Store.Path,
		"config", cfg.File, "tenants", len(cfg.Tenants), "downstreams", len(cfg.Downstreams),
		"tokens", len(cfg.Auth.Tokens), "tls", cfg.Server.TLSCert != "")
	if started != nil {
		started(ln.Addr().String())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("http server: %w", err)
	}

	// Stop: readiness false first, then the listener, then the dispatcher.
	stopping.Store(true)
	log.Info("stopping", "shutdown_timeout", cfg.Server.ShutdownTimeout.Std())
	deadline, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.Std())
	defer cancel()
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
