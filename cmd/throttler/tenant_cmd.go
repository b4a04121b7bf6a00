package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/client"
)

// newTenantCommand is `throttler tenant set|show|reset TENANT`: a tenant's
// policy set by the API, over the file's (DESIGN.md 6f).
func newTenantCommand(env []string) *cobra.Command {
	root := &cobra.Command{Use: "tenant", Short: "Show, set or reset a tenant's policy through the API"}
	var server, token, configFile string
	flags := func(c *cobra.Command) *cobra.Command {
		c.Flags().StringVar(&server, "server", "", "throttler API base URL")
		c.Flags().StringVar(&token, "token", "", "API token (default $THROTTLER_TOKEN)")
		c.Flags().StringVarP(&configFile, "config", "c", "", "config file to read the server address from")
		return c
	}
	run := func(call policyCall) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := dial(server, token, configFile, env)
			if err != nil {
				return err
			}
			p, err := call(c, cmd, args[0])
			if err != nil {
				if client.IsUnreachable(err) {
					return exitError{code: 3, err: err}
				}
				return err
			}
			printPolicy(cmd.OutOrStdout(), p)
			return nil
		}
	}
	const where = `

The server and token come from --server/--token, then THROTTLER_SERVER and
THROTTLER_TOKEN, then the config file (--config or THROTTLER_CONFIG), then
http://127.0.0.1:8080.`
	show := flags(&cobra.Command{
		Use:   "show TENANT",
		Short: "Show a tenant's policy and where each key comes from (api, plan, file, default)",
		Long:  "Show a tenant's policy in force, where each key comes from (api: set by the API; plan: the plan the API or the file's [tenants.X] names; file: [tenants.X]; default: tenant_defaults), and what the API set." + where,
		Args:  cobra.ExactArgs(1),
		RunE: run(func(c *client.Client, cmd *cobra.Command, t string) (client.Policy, error) {
			return c.Policy(cmd.Context(), t)
		}),
	})
	set := flags(newTenantSetCommand(run, where))
	reset := flags(&cobra.Command{
		Use:   "reset TENANT",
		Short: "Drop the policy the API set for a tenant: back to the file's (admin tokens only)",
		Long:  "Drop the policy the API set for a tenant: its policy is the file's again, in every process within a second. The token must be an admin's." + where,
		Args:  cobra.ExactArgs(1),
		RunE: run(func(c *client.Client, cmd *cobra.Command, t string) (client.Policy, error) {
			return c.ResetPolicy(cmd.Context(), t)
		}),
	})
	root.AddCommand(show, set, reset)
	return root
}

// policyCall is what one tenant subcommand asks the API for tenant t.
type policyCall func(c *client.Client, cmd *cobra.Command, t string) (client.Policy, error)

// newTenantSetCommand is `throttler tenant set` (without the connection
// flags): each key given becomes the API's layer; run makes the call and
// prints the answer; where says where the server comes from.
func newTenantSetCommand(run func(policyCall) func(*cobra.Command, []string) error, where string) *cobra.Command {
	var keys client.PolicyKeys
	var capacity, burst, maxAttempts, maxInFlight, maxScheduled int
	var horizon time.Duration
	var noWindows bool
	set := &cobra.Command{
		Use:   "set TENANT [--plan NAME] [--rate N/DURATION] [--capacity N] [--window N/DURATION ...] ...",
		Short: "Set a tenant's policy over the file's (admin tokens only)",
		Long: `Set a tenant's policy over the file's: a plan (--plan pro says all of
plan pro's keys) and/or keys, each over it. It replaces what the API set
before, is in force at once and in every process within a second, and is
kept across restarts and reloads. A policy that does not hold (an unknown
plan, a rate or window that does not parse) is refused naming the key, and
nothing changes. The token must be an admin's.` + where,
		Example: `  throttler tenant set acme --plan pro
  throttler tenant set acme --plan pro --capacity 50
  throttler tenant set acme --rate 5/s --window 1000/d
  throttler tenant set acme --max-scheduled 500 --schedule-horizon 168h`,
		Args: cobra.ExactArgs(1),
		RunE: run(func(c *client.Client, cmd *cobra.Command, t string) (client.Policy, error) {
			fl := cmd.Flags()
			for name, to := range map[string]**int{"capacity": &keys.Capacity, "burst": &keys.Burst, "max-attempts": &keys.MaxAttempts,
				"max-in-flight": &keys.MaxInFlight, "max-scheduled": &keys.MaxScheduled} {
				if fl.Changed(name) {
					v, _ := fl.GetInt(name)
					*to = &v
				}
			}
			if fl.Changed("schedule-horizon") {
				keys.ScheduleHorizon = horizon.String()
			}
			if noWindows {
				if len(keys.Windows) > 0 {
					return client.Policy{}, exitError{code: 2, err: fmt.Errorf("--no-windows and --window together: give one")}
				}
				keys.Windows = []string{}
			}
			return c.SetPolicy(cmd.Context(), t, keys)
		}),
	}
	set.Flags().StringVar(&keys.Plan, "plan", "", "a [plans.NAME] of the config: all of its keys")
	set.Flags().StringVar(&keys.Rate, "rate", "", "N/DURATION, such as 20/s")
	set.Flags().IntVar(&capacity, "capacity", 0, "most jobs waiting (leaky mode)")
	set.Flags().IntVar(&burst, "burst", 0, "most sent at once after a quiet spell")
	set.Flags().StringArrayVar(&keys.Windows, "window", nil, "a limit beside the rate, such as 1000/d (repeat for more)")
	set.Flags().BoolVar(&noWindows, "no-windows", false, "no windows, whatever the file or plan says")
	set.Flags().IntVar(&maxAttempts, "max-attempts", 0, "attempts per job (default: the downstream's)")
	set.Flags().IntVar(&maxInFlight, "max-in-flight", 0, "most attempts in flight at once (0: no cap)")
	set.Flags().IntVar(&maxScheduled, "max-scheduled", 0, "most jobs booked for later (not_before) at once, 1 to 1000000")
	set.Flags().DurationVar(&horizon, "schedule-horizon", 0, "how far ahead a job's not_before may be, such as 720h (at most 87600h)")
	set.Flags().StringVar(&keys.Mode, "mode", "", "leaky or token")
	set.Flags().StringVar(&keys.Downstream, "downstream", "", "the downstream its jobs go to")
	set.Flags().StringVar(&keys.CallbackURL, "callback-url", "", "where its jobs' ends are told when a job names none")
	return set
}

// printPolicy writes a tenant's policy: one key a line, with where it
// comes from.
func printPolicy(w io.Writer, p client.Policy) {
	plan := "none"
	if p.Plan != "" {
		plan = fmt.Sprintf("%s (from %s)", p.Plan, p.PlanFrom)
	}
	set := "none: the file's policy"
	if p.API != nil {
		set = "yes"
	}
	fmt.Fprintf(w, "tenant %s\nplan %s\nset by the API: %s\n", p.Tenant, plan, set)
	in := p.InForce
	maxAttempts := "the downstream's"
	if in.MaxAttempts != nil {
		maxAttempts = fmt.Sprint(*in.MaxAttempts)
	}
	windows := "none"
	if len(in.Windows) > 0 {
		windows = strings.Join(in.Windows, ", ")
	}
	callback := cmp.Or(in.CallbackURL, "none")
	rows := map[string]string{"downstream": in.Downstream, "mode": in.Mode, "rate": in.Rate, "capacity": fmt.Sprint(in.Capacity),
		"burst": fmt.Sprint(in.Burst), "windows": windows, "max_attempts": maxAttempts, "max_in_flight": fmt.Sprint(in.MaxInFlight),
		"max_scheduled": fmt.Sprint(in.MaxScheduled), "schedule_horizon": in.ScheduleHorizon, "callback_url": callback}
	for _, k := range slices.Sorted(maps.Keys(rows)) {
		fmt.Fprintf(w, "  %-16s %-24s %s\n", k, rows[k], p.From[k])
	}
}
