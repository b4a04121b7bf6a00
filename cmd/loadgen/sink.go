package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

// sinkCommand is a recording downstream on its own, for runs where the
// throttler is stopped, killed or restarted while it sends (deliver starts
// one too, but queues the jobs itself and ends when they have arrived).
func sinkCommand() *cobra.Command {
	var listen string
	var interval, silence, duration time.Duration
	var burst int
	c := &cobra.Command{
		Use:   "sink",
		Short: "Record every request a throttler sends until stopped; print repeats, silences and window-rule violations",
		Long: `Serves --listen as a downstream that answers 200 and records each request's
kernel receive time, tenant and Idempotency-Key, until SIGINT, SIGTERM or
--duration. Then it prints the arrivals, the keys that arrived more than
once, every silence longer than --silence (the stretch without any arrival:
a restart's downtime and start-up show as one), and the tenants whose
arrivals break the window rule at --interval and --burst (DESIGN.md
invariant 1, with its 2 ms of jitter).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loopbackOnly("http://" + listen); err != nil {
				return err
			}
			sink, err := downstreamtest.Start(listen)
			if err != nil {
				return err
			}
			defer sink.Close()
			fmt.Fprintf(cmd.ErrOrStderr(), "recording on %s until SIGINT or SIGTERM (at most %v)\n", listen, duration)
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
			select {
			case <-stop:
			case <-time.After(duration):
			}
			reportSink(cmd.OutOrStdout(), sink.All(), interval, burst, silence)
			return nil
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:19100", "address to serve (loopback)")
	c.Flags().DurationVar(&interval, "interval", time.Second, "the tenants' interval T, for the window rule")
	c.Flags().IntVar(&burst, "burst", 1, "the tenants' burst, for the window rule")
	c.Flags().DurationVar(&silence, "silence", time.Second, "report stretches without arrivals longer than this")
	c.Flags().DurationVar(&duration, "duration", 10*time.Minute, "stop recording after this")
	return c
}

// reportSink prints what a sink recorded (arrivals sorted by time).
func reportSink(w io.Writer, all []downstreamtest.Arrival, T time.Duration, burst int, silence time.Duration) {
	keys := map[string]int{}
	byTenant := map[string][]downstreamtest.Arrival{}
	for _, a := range all {
		keys[a.Key]++
		byTenant[a.Tenant] = append(byTenant[a.Tenant], a)
	}
	repeats := 0
	for _, n := range keys {
		repeats += n - 1
	}
	fmt.Fprintf(w, "arrivals %d, distinct keys %d (repeats %d), tenants %d\n", len(all), len(keys), repeats, len(byTenant))
	for i := 1; i < len(all); i++ {
		if gap := all[i].At.Sub(all[i-1].At); gap > silence {
			fmt.Fprintf(w, "silence of %v: from %s to %s (unix %.3f to %.3f)\n", gap.Round(time.Millisecond),
				all[i-1].At.Format(time.RFC3339Nano), all[i].At.Format(time.RFC3339Nano),
				float64(all[i-1].At.UnixNano())/1e9, float64(all[i].At.UnixNano())/1e9)
		}
	}
	violations, closest := 0, time.Duration(-1)
	for _, arr := range byTenant {
		for i := 1; i < len(arr); i++ {
			if gap := arr[i].At.Sub(arr[i-1].At); closest < 0 || gap < closest {
				closest = gap
			}
		}
		if v := downstreamtest.WindowViolation(arr, T, burst); v != "" {
			if violations == 0 {
				fmt.Fprintln(w, "first violation:", v)
			}
			violations++
		}
	}
	fmt.Fprintf(w, "closest pair of one tenant: %v (T = %v)\n", closest, T)
	fmt.Fprintf(w, "tenants breaking the window rule: %d of %d\n", violations, len(byTenant))
}
