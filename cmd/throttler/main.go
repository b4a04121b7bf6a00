// Command throttler is the service and its tools, one cobra tree built by
// newRootCommand: serve (the API and the dispatcher), status, pause and
// resume, simulate, config check and token new.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signalContext()
	defer stop()
	cmd := newRootCommand(os.Stdout, os.Stderr, os.Environ())
	if err := cmd.ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

// signalContext is done at the first SIGINT or SIGTERM; a second one exits
// at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "throttler: %v: stopping (send it again to exit at once)\n", sig)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "throttler: second signal: exiting now; jobs being sent are sent again after restart")
		os.Exit(130)
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}

// exitError carries an exit status through cobra.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// newRootCommand builds the command tree; env is the environment that
// config overrides come from.
func newRootCommand(stdout, stderr io.Writer, env []string) *cobra.Command {
	root := &cobra.Command{
		Use:           "throttler",
		Short:         "Queue jobs per tenant and deliver them to a rate-limited downstream at each tenant's rate",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentPostRun = nil
	root.AddCommand(newServeCommand(env), newConfigCommand(env), newStatusCommand(env), newTokenCommand(), newSimulateCommand(env))
	root.AddCommand(newHoldCommands(env)...)
	root.AddCommand(newTenantCommand(env))
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, c.CommandPath())
	})
	printErrors(root)
	return root
}

// printErrors makes every command print its error once, prefixed.
func printErrors(c *cobra.Command) {
	for _, sub := range c.Commands() {
		printErrors(sub)
	}
	run := c.RunE
	if run == nil {
		return
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		if err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "throttler:", err)
		}
		return err
	}
}
