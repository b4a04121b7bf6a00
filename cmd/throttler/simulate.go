package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"throttler/internal/config"
	"throttler/internal/leaky"
	"throttler/internal/simulate"
)

func newSimulateCommand(env []string) *cobra.Command {
	var (
		trace, scenario, rate, configFile, tenant, svgFile string
		capacity, burst                                    int
		asJSON                                             bool
	)
	cmd := &cobra.Command{
		Use:   "simulate (--trace arrivals.csv | --scenario NAME) [--rate 1/s --capacity 10 --burst 10 | --config FILE --tenant T] [--svg FILE] [--json]",
		Short: "Replay arrivals through fixed window, sliding window, token bucket and leaky bucket side by side",
		Long: `Replay arrival times through the classic algorithms under one limit and
print, for each: accepted, rejected, the longest wait, the most sent in any
window of the limit's length, and the most sent in any second.

The window algorithms allow burst per burst/rate (10 per 10s for 1/s with
burst 10); the token bucket holds burst; the leaky bucket queues capacity.
The token and leaky lanes run the service's own code: with --config and
--tenant, the lane of the tenant's mode is its exact policy (marked *), so
the simulation predicts what the service decides.

Scenarios: ` + strings.Join(simulate.Scenarios, ", ") + `. retry-storm compares
clients that retry at once with clients that honour Retry-After with jitter.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (trace == "") == (scenario == "") {
				return exitError{2, fmt.Errorf("give --trace FILE or --scenario NAME (one of %s)", strings.Join(simulate.Scenarios, ", "))}
			}
			var limit simulate.Limit
			if configFile != "" || tenant != "" {
				if configFile == "" || tenant == "" {
					return exitError{2, fmt.Errorf("--config and --tenant go together")}
				}
				for _, f := range []string{"rate", "capacity", "burst"} {
					if cmd.Flags().Changed(f) {
						return exitError{2, fmt.Errorf("--%s and --config: the tenant's settings come from the config", f)}
					}
				}
				cfg, err := config.Load(configFile, env, nil)
				if err != nil {
					return exitError{2, err}
				}
				ts, ok := cfg.Tenant(tenant)
				if !ok {
					return exitError{2, fmt.Errorf("tenant %q is not in %s and allow_unknown_tenants is false", tenant, configFile)}
				}
				limit = limitOf(ts)
			} else {
				r, err := leaky.ParseRate(rate)
				if err != nil {
					return exitError{2, fmt.Errorf("--rate: %w", err)}
				}
				if burst < 1 || capacity < 0 {
					return exitError{2, fmt.Errorf("--burst must be at least 1 and --capacity at least 0")}
				}
				limit = simulate.NewLimit(r.Interval(), burst, capacity)
			}
			var arrivals []time.Duration
			var err error
			if trace != "" {
				f, err := os.Open(trace)
				if err != nil {
					return exitError{2, err}
				}
				defer f.Close()
				if arrivals, err = simulate.ParseTrace(f); err != nil {
					return exitError{2, fmt.Errorf("%s: %w", trace, err)}
				}
			} else if arrivals, err = simulate.Scenario(scenario, limit); err != nil {
				return exitError{2, err}
			}
			out := cmd.OutOrStdout()
			results := simulate.Run(limit, arrivals)
			var honour []simulate.Result
			if scenario == "retry-storm" {
				results = simulate.Storm(limit, arrivals, simulate.AtOnce, 1)
				honour = simulate.Storm(limit, arrivals, simulate.HonourRetryAfter, 1)
			}
			if svgFile != "" {
				f, err := os.Create(svgFile)
				if err != nil {
					return err
				}
				drawn := results
				if honour != nil {
					drawn = honour
				}
				if err := simulate.SVG(f, limit, drawn); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			switch {
			case asJSON:
				return simulate.JSON(out, limit, results, honour)
			case honour != nil:
				return simulate.StormTable(out, limit, len(arrivals), results, honour)
			default:
				return simulate.Table(out, limit, len(arrivals), results)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&trace, "trace", "", "arrival times, seconds from the start, one per line (CSV: first column)")
	f.StringVar(&scenario, "scenario", "", "a built-in scenario: "+strings.Join(simulate.Scenarios, ", "))
	f.StringVar(&rate, "rate", "1/s", "the limit's rate, N/DURATION")
	f.IntVar(&capacity, "capacity", 10, "the leaky bucket's queue")
	f.IntVar(&burst, "burst", 10, "the token bucket's size, and what the window algorithms allow per burst/rate")
	f.StringVar(&configFile, "config", "", "take the limit from this config file's --tenant")
	f.StringVar(&tenant, "tenant", "", "the tenant whose settings to use (with --config)")
	f.StringVar(&svgFile, "svg", "", "also draw the lanes into this SVG file")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// limitOf is the limit of a tenant's settings: its own policy in the lane of
// its mode, and the other lanes under the same rate and burst.
func limitOf(ts config.TenantSettings) simulate.Limit {
	p := ts.Policy()
	l := simulate.NewLimit(p.Interval, p.Burst, p.Capacity)
	l.Service = ts.Mode
	if ts.Mode == config.ModeToken {
		l.Token = p
	} else {
		l.Leaky = p
	}
	return l
}
