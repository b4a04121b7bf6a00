package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"throttler/internal/api"
	"throttler/internal/config"
	"throttler/internal/dispatch"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

func newServeCommand(env []string) *cobra.Command {
	var flags configFlags
	var listen, pprofListen string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the API and the dispatcher",
		Long: `Run the API and the dispatcher on the embedded store.

SIGINT or SIGTERM stop it cleanly: readiness goes false, the API stops taking
requests, attempts in progress finish (within server.shutdown_timeout) and
their outcome is recorded; waiting jobs stay in the store for the next start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var extra []string
			if listen != "" {
				extra = append(extra, "server.listen="+listen)
			}
			cfg, err := flags.load(env, extra...)
			if err != nil {
				return exitError{code: 2, err: err}
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			if pprofListen != "" {
				if err := startPprof(pprofListen, log); err != nil {
					return exitError{code: 2, err: err}
				}
			}
			return serve(cmd.Context(), cfg, log, nil)
		},
	}
	flags.register(c)
	c.Flags().StringVar(&listen, "listen", "", "host:port to listen on (overrides server.listen)")
	c.Flags().StringVar(&pprofListen, "pprof-listen", "", "serve Go profiles (net/http/pprof) on this loopback host:port, for diagnosis")
	return c
}

// serve runs until ctx is done, then stops cleanly. started, if not nil,
// is told the address the API listens on.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger, started func(addr string)) error {
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
	client := dispatch.NewClient(cfg.Dispatch.Concurrency)
	defer client.CloseIdleConnections()
	d := dispatch.New(dispatch.Options{
		Client: client,
		Logger: log,
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
			Store:  store,
			Config: func() *config.Config { return cfg },
			Logger: log,
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
	go func() { serveErr <- srv.Serve(ln) }()

	consumeCtx, stopConsume := context.WithCancel(context.Background())
	consumeDone := make(chan error, 1)
	go func() {
		consumeDone <- store.Consume(consumeCtx, d.Handle, queue.ConsumeOptions{Concurrency: cfg.Dispatch.Concurrency})
	}()
	log.Info("throttler started", "addr", ln.Addr().String(), "store", cfg.Store.Backend, "path", cfg.Store.Path,
		"config", cfg.File, "tenants", len(cfg.Tenants), "downstreams", len(cfg.Downstreams))
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

// startPprof serves the Go profiler on a separate loopback listener.
func startPprof(addr string, log *slog.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
		return fmt.Errorf("--pprof-listen %q: profiles are served on loopback addresses only", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("serving profiles", "addr", ln.Addr().String())
	go http.Serve(ln, mux)
	return nil
}
