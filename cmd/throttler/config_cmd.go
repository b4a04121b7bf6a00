package main

import (
	"cmp"
	"fmt"

	"github.com/spf13/cobra"

	"throttler/internal/config"
)

// configFlags are the flags every command that reads config.toml takes.
type configFlags struct {
	file string
	set  []string
}

func (f *configFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.file, "config", "c", "", "config file (default: $THROTTLER_CONFIG, else built-in defaults)")
	c.Flags().StringArrayVar(&f.set, "set", nil, "override one key, e.g. --set server.listen=127.0.0.1:9090 (repeatable)")
}

func (f *configFlags) load(env []string, extra ...string) (*config.Config, error) {
	file := cmp.Or(f.file, lookup(env, "THROTTLER_CONFIG"))
	return config.Load(file, env, append(append([]string(nil), f.set...), extra...))
}

func lookup(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if len(env[i]) > len(name) && env[i][:len(name)+1] == name+"=" {
			return env[i][len(name)+1:]
		}
	}
	return ""
}

func newConfigCommand(env []string) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Work with config files"}
	var flags configFlags
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a config file (with env and --set overrides) and say what it configures",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := flags.load(env)
			if err != nil {
				return exitError{code: 2, err: err}
			}
			name := cmp.Or(cfg.File, "built-in defaults")
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: %d downstream(s), %d named tenant(s), listen %s, store %s\n",
				name, len(cfg.Downstreams), len(cfg.Tenants), cfg.Server.Listen, cfg.Store.Backend)
			return nil
		},
	}
	flags.register(check)
	c.AddCommand(check)
	return c
}
