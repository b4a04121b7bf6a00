package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/service"
)

// runService is service.Run. Only the package's tests replace it, in a
// copy of the test binary run as a server (TestMain), to set options that
// no config setting, flag or environment variable reaches.
var runService = service.Run

func newServeCommand(env []string) *cobra.Command {
	var flags configFlags
	var listen, pprofListen, role string
	var insecureNoAuth bool
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the API and the dispatcher",
		Long: `Run the API and the dispatcher.

On the embedded store (the default) one process does both. On Redis
(store.backend = "redis") any number of processes share the work, each with
--role all (both), api (admits jobs, sends none) or worker (sends jobs; serves
only /healthz, /readyz and /metrics).

SIGINT or SIGTERM stop it cleanly: readiness goes false, the API stops taking
requests, attempts in progress finish (within server.shutdown_timeout) and
their outcome is recorded; waiting jobs stay in the store for the next start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var extra []string
			if listen != "" {
				extra = append(extra, "server.listen="+listen)
			}
			if insecureNoAuth {
				extra = append(extra, "auth.insecure_no_auth=true")
			}
			cfg, err := flags.load(env, extra...)
			if err != nil {
				return exitError{code: 2, err: err}
			}
			log := newLogger(cmd.ErrOrStderr(), cfg.Log)
			if pprofListen != "" {
				if err := startPprof(pprofListen, log); err != nil {
					return exitError{code: 2, err: err}
				}
			}
			// SIGHUP: read the config again; a broken one is refused and the
			// running one kept.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			reloads := make(chan *config.Config)
			go func() {
				for {
					select {
					case <-cmd.Context().Done():
						return
					case <-hup:
					}
					next, err := flags.load(env, extra...)
					if err != nil {
						log.Error("config reload refused; the running config is kept", "err", err)
						continue
					}
					select {
					case reloads <- next:
					case <-cmd.Context().Done():
						return
					}
				}
			}()
			return runService(cmd.Context(), service.Options{Config: cfg, Logger: log, Reloads: reloads, Role: role})
		},
	}
	flags.register(c)
	c.Flags().StringVar(&listen, "listen", "", "host:port to listen on (overrides server.listen)")
	c.Flags().BoolVar(&insecureNoAuth, "insecure-no-auth", false, "allow listening beyond loopback with no API tokens (a fully trusted network only)")
	c.Flags().StringVar(&role, "role", service.RoleAll, "what this process does: all, api or worker (api and worker need store.backend = \"redis\")")
	c.Flags().StringVar(&pprofListen, "pprof-listen", "", "serve Go profiles (net/http/pprof) on this loopback host:port, for diagnosis")
	return c
}

// newLogger logs with slog: text on a terminal, JSON otherwise (or as
// log.format says), at log.level.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	format := c.Format
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
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
