package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/spf13/cobra"

	"throttler/internal/service"
)

func newServeCommand(env []string) *cobra.Command {
	var flags configFlags
	var listen, pprofListen string
	var insecureNoAuth bool
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
			if insecureNoAuth {
				extra = append(extra, "auth.insecure_no_auth=true")
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
			return service.Run(cmd.Context(), cfg, log, nil)
		},
	}
	flags.register(c)
	c.Flags().StringVar(&listen, "listen", "", "host:port to listen on (overrides server.listen)")
	c.Flags().BoolVar(&insecureNoAuth, "insecure-no-auth", false, "allow listening beyond loopback with no API tokens (a fully trusted network only)")
	c.Flags().StringVar(&pprofListen, "pprof-listen", "", "serve Go profiles (net/http/pprof) on this loopback host:port, for diagnosis")
	return c
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
