// Command enqueue sends jobs to a throttler: one payload (--data) or a file
// of them, one JSON value per line (--file, "-" for stdin). It is the client
// a rate-limited API wishes every caller were: it honours Retry-After (with
// jitter), backs off exponentially from errors, caps its attempts, paces
// itself (by the server's RateLimit fields, or --rate), and never sends a
// line twice when re-run after an
// interruption (each line's idempotency key comes from its content and line
// number).
//
// Exit status: 0 every job accepted (and, with --wait, delivered); 1 the
// server refused the request (unknown tenant, auth, ...); 2 bad input; 3
// server unreachable; 4 jobs still refused after --max-attempts, or refused
// for good (422, or 429 schedule_full); 5 with --wait, jobs that failed or were not delivered in
// time; 130 interrupted. With --wait, the summary shows how jobs ended and
// what their downstream answered.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := newCommand(os.Stdin, os.Stdout, os.Stderr, os.Environ())
	err := cmd.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		if !ee.silent {
			fmt.Fprintln(os.Stderr, "enqueue:", err)
		}
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "enqueue:", err) // cobra's own, such as a required flag missing
		os.Exit(exitUsage)
	}
}

// Exit statuses.
const (
	exitOK           = 0
	exitRefused      = 1
	exitBadInput     = 2
	exitUnreachable  = 3
	exitRejected     = 4
	exitNotDelivered = 5
	exitUsage        = 2
	exitInterrupted  = 130
)

// exitError carries an exit status; its message has been printed already
// when silent is set.
type exitError struct {
	code   int
	err    error
	silent bool
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
