package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/queue"
)

// ceilingCommand serves the enqueue route's request and answer shape and
// keeps nothing: what HTTP and JSON alone allow on this machine, to measure
// the throttler against in the same run (loadgen admit --ceiling).
func ceilingCommand() *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "ceiling",
		Short: "Serve POST /v1/tenants/{tenant}/jobs as the API does (same JSON in, same 202 out) and keep nothing",
		Long: `Serves POST /v1/tenants/{tenant}/jobs: decodes the body as the API does
(one JSON object, unknown fields refused, nothing after it), makes a job id
as the stores do, and answers the API's 202 body and RateLimit headers. It
keeps nothing and writes nothing: it is the ceiling that HTTP and JSON alone
allow on this machine. Run it as its own process beside throttler serve and
compare with loadgen admit --ceiling. Stops on SIGINT or SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := loopbackOnly("http://" + listen); err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: ceilingHandler(), ReadHeaderTimeout: 5 * time.Second}
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
			go func() { <-stop; srv.Close() }()
			fmt.Fprintf(cmd.ErrOrStderr(), "ceiling serving on http://%s\n", ln.Addr())
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:8090", "loopback host:port to serve on")
	return c
}

// ceilingJob is the enqueue route's request body.
type ceilingJob struct {
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key"`
	Cost           *int            `json:"cost"`
	Deadline       string          `json:"deadline"`
	ExpiresIn      string          `json:"expires_in"`
}

// ceilingAnswer is the enqueue route's 202 body.
type ceilingAnswer struct {
	ID              string    `json:"id"`
	Tenant          string    `json:"tenant"`
	State           string    `json:"state"`
	DispatchAt      time.Time `json:"dispatch_at"`
	ExpectedDelayMs int64     `json:"expected_delay_ms"`
	QueueDepth      int       `json:"queue_depth"`
	Capacity        int       `json:"capacity"`
}

func ceilingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/tenants/{tenant}/jobs", func(w http.ResponseWriter, r *http.Request) {
		var j ceilingJob
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil || len(j.Payload) == 0 {
			http.Error(w, `{"error":"invalid_json"}`, http.StatusBadRequest)
			return
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			http.Error(w, `{"error":"invalid_json"}`, http.StatusBadRequest)
			return
		}
		now := time.Now()
		w.Header().Set("RateLimit-Policy", `"leaky";q=1000001;w=3600000400`)
		w.Header().Set("RateLimit", `"leaky";r=1000000;t=3600`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(ceilingAnswer{
			ID: queue.NewID(now), Tenant: r.PathValue("tenant"), State: string(queue.StateQueued),
			DispatchAt: now.UTC(), QueueDepth: 1, Capacity: 1000000,
		})
	})
	return mux
}
