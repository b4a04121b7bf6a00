package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/internal/target"
)

func newStatusCommand(env []string) *cobra.Command {
	var server, token, configFile string
	var watch, asJSON bool
	var interval time.Duration
	var rounds int
	c := &cobra.Command{
		Use:   "status [TENANT]",
		Short: "Show tenants' queues: depth, expected delay, rate, totals",
		Long: `Show what the API says of each active tenant (or of one), as a table.
--watch redraws it in place every --interval; --json prints the API's view.

The server and token come from --server/--token, then THROTTLER_SERVER and
THROTTLER_TOKEN, then the config file (--config or THROTTLER_CONFIG), then
http://127.0.0.1:8080.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := dial(server, token, configFile, env)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for i := 0; ; i++ {
				tenants, err := fetchStatus(cmd.Context(), c, args)
				if err != nil {
					if client.IsUnreachable(err) {
						return exitError{code: 3, err: err}
					}
					return err
				}
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if err := enc.Encode(tenants); err != nil {
						return err
					}
				} else {
					if watch {
						fmt.Fprint(out, "\x1b[H\x1b[2J") // home, clear: redraw in place
						fmt.Fprintf(out, "%s  every %v  %s\n\n", c.Server(), interval, time.Now().Format("15:04:05"))
					}
					renderStatus(out, tenants)
				}
				if !watch || (rounds > 0 && i+1 >= rounds) {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	c.Flags().StringVar(&server, "server", "", "throttler API base URL")
	c.Flags().StringVar(&token, "token", "", "API token (default $THROTTLER_TOKEN)")
	c.Flags().StringVarP(&configFile, "config", "c", "", "config file to read the server address from")
	c.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every --interval until interrupted")
	c.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often --watch redraws")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().IntVar(&rounds, "rounds", 0, "with --watch, stop after this many redraws (0: until interrupted)")
	_ = c.Flags().MarkHidden("rounds")
	return c
}

// dial is the API client of a command: the server and token from flags,
// environment or config file (internal/target); exit status 2 if they are
// wrong.
func dial(server, token, configFile string, env []string) (*client.Client, error) {
	t, err := target.Resolve(server, token, configFile, env)
	if err != nil {
		return nil, exitError{code: 2, err: err}
	}
	c, err := client.New(t.Server, client.WithToken(t.Token))
	if err != nil {
		return nil, exitError{code: 2, err: err}
	}
	return c, nil
}

func fetchStatus(ctx context.Context, c *client.Client, args []string) ([]client.Tenant, error) {
	if len(args) == 1 {
		t, err := c.Tenant(ctx, args[0])
		if err != nil {
			var ae *client.APIError
			if errors.As(err, &ae) {
				return nil, fmt.Errorf("tenant %s: %s", args[0], ae.Message)
			}
			return nil, err
		}
		return []client.Tenant{t}, nil
	}
	return c.Tenants(ctx)
}

// renderStatus prints tenants as an aligned table.
func renderStatus(w io.Writer, tenants []client.Tenant) {
	if len(tenants) == 0 {
		fmt.Fprintln(w, "no tenant has jobs waiting or in flight")
		return
	}
	var buf bytes.Buffer
	defer func() {
		for _, line := range strings.SplitAfter(buf.String(), "\n") {
			io.WriteString(w, strings.TrimRight(line, " \n"))
			if strings.HasSuffix(line, "\n") {
				io.WriteString(w, "\n")
			}
		}
	}()
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMODE\tRATE\tDEPTH\tCAPACITY\tSCHEDULED\tIN FLIGHT\tDELAY\tPAUSED UNTIL\tACCEPTED\tREJECTED\tDELIVERED\tFAILED\t")
	for _, t := range tenants {
		paused := "-"
		if t.Paused {
			paused = "indefinitely"
			if t.PausedUntil != nil {
				paused = t.PausedUntil.Local().Format("15:04:05")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t\n", t.Tenant, t.Mode, formatRate(t.RatePerSecond),
			t.QueueDepth, t.Capacity, t.Scheduled, t.InFlight, formatDelay(t.ExpectedDelayMS), paused,
			t.AcceptedTotal, t.RejectedTotal, t.DeliveredTotal, t.FailedTotal)
	}
	tw.Flush()
}

func formatRate(perSecond float64) string {
	switch {
	case perSecond >= 1:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", perSecond), "0"), ".") + "/s"
	case perSecond*60 >= 1:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", perSecond*60), "0"), ".") + "/m"
	default:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", perSecond*3600), "0"), ".") + "/h"
	}
}

// formatDelay rounds to what a person reads: milliseconds under a second,
// tenths under a minute, seconds under an hour, minutes beyond.
func formatDelay(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}
