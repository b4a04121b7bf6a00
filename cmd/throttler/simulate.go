package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/simulate"
)

// simulateFlags are the flags of `throttler simulate`.
type simulateFlags struct {
	trace, scenario, rate, configFile, tenant, svgFile string
	capacity, burst                                    int
	asJSON                                             bool
}

func newSimulateCommand(env []string) *cobra.Command {
	var sf simulateFlags
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
		RunE: func(cmd *cobra.Command, args []string) error { return sf.run(cmd, env) },
	}
	f := cmd.Flags()
	f.StringVar(&sf.trace, "trace", "", "arrival times, seconds from the start, one per line (CSV: first column)")
	f.StringVar(&sf.scenario, "scenario", "", "a built-in scenario: "+strings.Join(simulate.Scenarios, ", "))
	f.StringVar(&sf.rate, "rate", "1/s", "the limit's rate, N/DURATION")
	f.IntVar(&sf.capacity, "capacity", 10, "the leaky bucket's queue")
	f.IntVar(&sf.burst, "burst", 10, "the token bucket's size, and what the window algorithms allow per burst/rate")
	f.StringVar(&sf.configFile, "config", "", "take the limit from this config file's --tenant")
	f.StringVar(&sf.tenant, "tenant", "", "the tenant whose settings to use (with --config)")
	f.StringVar(&sf.svgFile, "svg", "", "also draw the lanes into this SVG file")
	f.BoolVar(&sf.asJSON, "json", false, "print JSON")
	return cmd
}

func (sf *simulateFlags) run(cmd *cobra.Command, env []string) error {
	if (sf.trace == "") == (sf.scenario == "") {
		return exitError{2, fmt.Errorf("give --trace FILE or --scenario NAME (one of %s)", strings.Join(simulate.Scenarios, ", "))}
	}
	limit, err := sf.limit(cmd, env)
	if err != nil {
		return err
	}
	arrivals, err := sf.arrivals(limit)
	if err != nil {
		return err
	}
	results := simulate.Run(limit, arrivals)
	var honour []simulate.Result
	if sf.scenario == "retry-storm" {
		results = simulate.Storm(limit, arrivals, simulate.AtOnce, 1)
		honour = simulate.Storm(limit, arrivals, simulate.HonourRetryAfter, 1)
	}
	if sf.svgFile != "" {
		drawn := results
		if honour != nil {
			drawn = honour
		}
		if err := writeSVG(sf.svgFile, limit, drawn); err != nil {
			return err
		}
	}
	out := cmd.OutOrStdout()
	switch {
	case sf.asJSON:
		return simulate.JSON(out, limit, results, honour)
	case honour != nil:
		return simulate.StormTable(out, limit, len(arrivals), results, honour)
	default:
		return simulate.Table(out, limit, len(arrivals), results)
	}
}

// limit is the limit simulated: a config's tenant, or the flags'.
func (sf *simulateFlags) limit(cmd *cobra.Command, env []string) (simulate.Limit, error) {
	if sf.configFile == "" && sf.tenant == "" {
		r, err := leaky.ParseRate(sf.rate)
		if err != nil {
			return simulate.Limit{}, exitError{2, fmt.Errorf("--rate: %w", err)}
		}
		if sf.burst < 1 || sf.capacity < 0 {
			return simulate.Limit{}, exitError{2, fmt.Errorf("--burst must be at least 1 and --capacity at least 0")}
		}
		return simulate.NewLimit(r.Interval(), sf.burst, sf.capacity), nil
	}
	if sf.configFile == "" || sf.tenant == "" {
		return simulate.Limit{}, exitError{2, fmt.Errorf("--config and --tenant go together")}
	}
	for _, f := range []string{"rate", "capacity", "burst"} {
		if cmd.Flags().Changed(f) {
			return simulate.Limit{}, exitError{2, fmt.Errorf("--%s and --config: the tenant's settings come from the config", f)}
		}
	}
	cfg, err := config.Load(sf.configFile, env, nil)
	if err != nil {
		return simulate.Limit{}, exitError{2, err}
	}
	ts, ok := cfg.Tenant(sf.tenant)
	if !ok {
		return simulate.Limit{}, exitError{2, fmt.Errorf("tenant %q is not in %s and allow_unknown_tenants is false", sf.tenant, sf.configFile)}
	}
	return limitOf(ts), nil
}

// arrivals reads the trace, or makes the scenario's arrivals.
func (sf *simulateFlags) arrivals(limit simulate.Limit) ([]time.Duration, error) {
	if sf.trace == "" {
		arrivals, err := simulate.Scenario(sf.scenario, limit)
		if err != nil {
			return nil, exitError{2, err}
		}
		return arrivals, nil
	}
	f, err := os.Open(sf.trace)
	if err != nil {
		return nil, exitError{2, err}
	}
	defer f.Close()
	arrivals, err := simulate.ParseTrace(f)
	if err != nil {
		return nil, exitError{2, fmt.Errorf("%s: %w", sf.trace, err)}
	}
	return arrivals, nil
}

func writeSVG(path string, limit simulate.Limit, results []simulate.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := simulate.SVG(f, limit, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
