package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/client"
)

// newHoldCommands are `throttler pause TENANT` and `throttler resume
// TENANT`: an operator's hold, through the API (admin tokens only).
func newHoldCommands(env []string) []*cobra.Command {
	build := func(verb, short string, call func(*client.Client, *cobra.Command, string) (client.Tenant, error)) *cobra.Command {
		var server, token, configFile string
		c := &cobra.Command{
			Use:   verb + " TENANT",
			Short: short,
			Long: short + `.

The server and token come from --server/--token, then THROTTLER_SERVER and
THROTTLER_TOKEN, then the config file (--config or THROTTLER_CONFIG), then
http://127.0.0.1:8080. The token must be an admin's.`,
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := dial(server, token, configFile, env)
				if err != nil {
					return err
				}
				t, err := call(c, cmd, args[0])
				if err != nil {
					if client.IsUnreachable(err) {
						return exitError{code: 3, err: err}
					}
					return err
				}
				state := "running"
				switch {
				case t.Held:
					state = "held until resumed"
				case t.Paused && t.PausedUntil != nil:
					state = "paused until " + t.PausedUntil.Local().Format("15:04:05") + " by the downstream"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s; %d waiting, expected delay %s\n", t.Tenant, state, t.QueueDepth, formatDelay(t.ExpectedDelayMS))
				return nil
			},
		}
		c.Flags().StringVar(&server, "server", "", "throttler API base URL")
		c.Flags().StringVar(&token, "token", "", "API token (default $THROTTLER_TOKEN)")
		c.Flags().StringVarP(&configFile, "config", "c", "", "config file to read the server address from")
		return c
	}
	return []*cobra.Command{
		build("pause", "Hold a tenant: nothing of it is sent until it is resumed (it keeps accepting while it has room)",
			func(c *client.Client, cmd *cobra.Command, t string) (client.Tenant, error) {
				return c.Pause(cmd.Context(), t)
			}),
		build("resume", "End a tenant's hold: its queue goes on one interval apart, in order",
			func(c *client.Client, cmd *cobra.Command, t string) (client.Tenant, error) {
				return c.Resume(cmd.Context(), t)
			}),
	}
}
