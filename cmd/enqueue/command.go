package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/target"
)

type options struct {
	server, token, config string
	tenant                string
	data, file            string
	key                   string
	noDedupe              bool
	maxAttempts           int
	rate                  string
	batch                 int
	wait                  bool
	waitTimeout           time.Duration
	asJSON                bool
	progress              string
	cost                  int
	expiresIn             time.Duration
	deadline              time.Time // now + expiresIn, fixed before the first try
	notBeforeText         string    // --not-before, RFC 3339
	delay                 time.Duration
	notBefore             time.Time // --not-before, or now + --delay, fixed before the first try
	request               string    // --request: what every job asks of its downstream's request
}

func newCommand(stdin io.Reader, stdout, stderr io.Writer, env []string) *cobra.Command {
	var o options
	c := &cobra.Command{
		Use:   "enqueue --tenant T (--data JSON | --file FILE | --file -)",
		Short: "Send jobs to a throttler, politely",
		Long: `Send jobs to a throttler: one payload (--data) or a file of them, one JSON
value per line (--file; "-" reads standard input; blank lines are skipped).

Every line of a file gets an idempotency key made from its line number and
content, so running the same import again after an interruption sends
nothing twice (--no-dedupe turns that off).

Without --rate it paces itself by the RateLimit fields of the server's
answers: the first request carries one job, each next one at most as many
as the tenant has room for, and when it has none enqueue waits until it
has (up to a minute; a longer wait is left to the 429 and its Retry-After).
A job refused with 429 is sent again after its Retry-After plus a little
jitter; errors and 503 back off exponentially; each job is tried at most
--max-attempts times.

--not-before (an RFC 3339 time) or --delay (a duration from the start of
the run) schedules every job: each is booked at the first slot at or after
that time the tenant's limits allow. A job refused because the tenant has
its max_scheduled jobs booked (429 schedule_full, with no Retry-After) or
because the time is past its schedule_horizon (422 too_far_ahead) is not
sent again.

--request gives every job the same request of its downstream (a path, a
method, query parameters, headers), as far as the downstream allows; a job
whose request or payload its downstream cannot send is refused for good.
With --wait, the summary then lists how jobs ended (failed ones first), each
with its downstream's answer: the status and the start of the body kept.

The server and token come from --server/--token, then THROTTLER_SERVER and
THROTTLER_TOKEN, then the config file (--config or THROTTLER_CONFIG), then
http://127.0.0.1:8080.

Exit status: 0 all accepted (with --wait: all delivered); 1 the server
refused the request; 2 bad input; 3 server unreachable; 4 jobs still
refused after --max-attempts, or refused for good (422: past their
deadline, too costly, too far ahead, or a request their downstream does
not allow; 429 schedule_full); 5 with --wait, jobs not delivered; 130
interrupted.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := run(cmd.Context(), o, stdin, stdout, stderr, env)
			var ee exitError
			if err != nil && (!errors.As(err, &ee) || !ee.silent) {
				fmt.Fprintln(stderr, "enqueue:", err)
				if errors.As(err, &ee) {
					ee.silent = true // printed: main prints what was not
					return ee
				}
			}
			return err
		},
	}
	c.SetOut(stdout)
	c.SetErr(stderr)
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		err = fmt.Errorf("%w (see enqueue --help)", err)
		fmt.Fprintln(stderr, "enqueue:", err)
		return exitError{code: exitUsage, err: err, silent: true}
	})
	f := c.Flags()
	f.StringVar(&o.server, "server", "", "throttler API base URL (default $THROTTLER_SERVER, the config's server.listen, or http://127.0.0.1:8080)")
	f.StringVar(&o.token, "token", "", "API token (default $THROTTLER_TOKEN)")
	f.StringVar(&o.config, "config", "", "throttler config file to read the server address from (default $THROTTLER_CONFIG)")
	f.StringVarP(&o.tenant, "tenant", "t", "", "tenant to enqueue for (required)")
	f.StringVarP(&o.data, "data", "d", "", "one payload, as JSON")
	f.StringVarP(&o.file, "file", "f", "", `file of payloads, one JSON value per line ("-" for stdin)`)
	f.StringVar(&o.key, "idempotency-key", "", "idempotency key of --data; with --file, the prefix of each line's key")
	f.BoolVar(&o.noDedupe, "no-dedupe", false, "do not derive idempotency keys for file lines")
	f.IntVar(&o.maxAttempts, "max-attempts", 10, "tries per job (429s and errors) before giving up")
	f.StringVar(&o.rate, "rate", "", `pace sending to N/DURATION, e.g. "19/s" just under a tenant's 20/s (default: by the server's RateLimit fields)`)
	f.IntVar(&o.batch, "batch", 100, "jobs per request, 1 to 1000")
	f.BoolVar(&o.wait, "wait", false, "after sending, wait until every job is delivered or failed")
	f.DurationVar(&o.waitTimeout, "wait-timeout", time.Hour, "give up --wait after this")
	f.BoolVar(&o.asJSON, "json", false, "print the summary as JSON")
	f.IntVar(&o.cost, "cost", 0, "slots of the schedule each job takes (e.g. SMS segments; default 1)")
	f.DurationVar(&o.expiresIn, "expires-in", 0, "each job is worthless this long from now: refused (not retried) if it cannot be sent by then")
	f.StringVar(&o.notBeforeText, "not-before", "", `schedule every job: not sent before this RFC 3339 time, such as "2026-12-08T09:00:00Z"`)
	f.DurationVar(&o.delay, "delay", 0, "schedule every job: not sent before this long from the start of the run (not with --not-before)")
	f.StringVar(&o.request, "request", "", `what each job asks of its downstream's request, as JSON: {"method":"POST","path":"/v1/refunds","query":{...},"headers":{...}} (only what the downstream allows)`)
	f.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (a bar on a terminal, lines otherwise), bar, lines or none")
	_ = c.MarkFlagRequired("tenant")
	return c
}

// item is one job of the run.
type item struct {
	line      int // 1-based line of the file (1 for --data)
	job       client.Job
	attempts  int
	notBefore time.Time
	result    client.Result // the last answer
	accepted  bool
	given     bool // refused for good
	final     client.JobStatus
}

// summary is what a run did.
type summary struct {
	Jobs        int      `json:"jobs"`
	Accepted    int      `json:"accepted"`
	Duplicates  int      `json:"duplicates"`
	Rejected    int      `json:"rejected"`
	Requests    int      `json:"requests"`
	Waits       int      `json:"retry_after_waits"`
	Refusals    int      `json:"refusals"` // 429 answers to jobs, each sent again or given up
	Delivered   int      `json:"delivered,omitempty"`
	Failed      int      `json:"failed,omitempty"`
	Undelivered int      `json:"undelivered,omitempty"`
	Impossible  int      `json:"impossible,omitempty"` // of Rejected: 422 or 429 schedule_full, not worth retrying
	Scheduled   int      `json:"scheduled,omitempty"`  // of Accepted: booked for later (state "scheduled")
	Seconds     float64  `json:"seconds"`
	Exit        int      `json:"exit"`
	Error       string   `json:"error,omitempty"`
	IDs         []string `json:"ids"`
	// Outcomes (--wait): how each job that ended ended, and its
	// downstream's answer.
	Outcomes []outcome `json:"outcomes,omitempty"`
}

func readItems(o options, stdin io.Reader) ([]*item, error) {
	switch {
	case o.data != "" && o.file != "":
		return nil, errors.New("give --data or --file, not both")
	case o.data != "":
		if !json.Valid([]byte(o.data)) {
			return nil, errors.New("--data is not valid JSON")
		}
		return []*item{{line: 1, job: client.Job{Payload: json.RawMessage(o.data), IdempotencyKey: o.key}}}, nil
	case o.file == "":
		return nil, errors.New("give --data JSON or --file FILE (- for stdin)")
	}
	var r io.Reader = stdin
	name := "stdin"
	if o.file != "-" {
		f, err := os.Open(o.file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r, name = f, o.file
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var items []*item
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if !json.Valid(line) {
			return nil, fmt.Errorf("%s:%d: not valid JSON (one payload per line); nothing was sent", name, n)
		}
		it := &item{line: n, job: client.Job{Payload: json.RawMessage(bytes.Clone(line))}}
		if !o.noDedupe {
			it.job.IdempotencyKey = lineKey(o.key, n, line)
		}
		items = append(items, it)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v; nothing was sent", name, err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s: no payloads in it", name)
	}
	return items, nil
}

// lineKey is a file line's idempotency key: the line number and a hash of
// its content (so an edited line is a new job), after the user's prefix.
func lineKey(prefix string, n int, line []byte) string {
	sum := sha256.Sum256(line)
	k := fmt.Sprintf("line%d-%s", n, hex.EncodeToString(sum[:12]))
	if prefix != "" {
		k = prefix + "-" + k
	}
	return k
}

func run(ctx context.Context, o options, stdin io.Reader, stdout, stderr io.Writer, env []string) error {
	start := time.Now()
	bad := func(err error) error { return exitError{code: exitBadInput, err: err} }
	if o.batch < 1 || o.batch > 1000 {
		return bad(fmt.Errorf("--batch %d: want 1 to 1000", o.batch))
	}
	if o.maxAttempts < 1 {
		return bad(fmt.Errorf("--max-attempts %d: want at least 1", o.maxAttempts))
	}
	if o.cost < 0 {
		return bad(fmt.Errorf("--cost %d: want at least 1", o.cost))
	}
	if o.expiresIn < 0 {
		return bad(fmt.Errorf("--expires-in %v: want a positive duration", o.expiresIn))
	}
	if o.expiresIn > 0 {
		// One deadline for every try: a retry after a 429 must not get
		// more time than the first try had.
		o.deadline = time.Now().Add(o.expiresIn)
	}
	if err := o.schedule(); err != nil {
		return bad(err)
	}
	var pace time.Duration
	if o.rate != "" {
		r, err := leaky.ParseRate(o.rate)
		if err != nil {
			return bad(fmt.Errorf("--rate: %v", err))
		}
		pace = r.Interval()
	}
	tg, err := target.Resolve(o.server, o.token, o.config, env)
	if err != nil {
		return bad(err)
	}
	c, err := client.New(tg.Server, client.WithToken(tg.Token))
	if err != nil {
		return bad(err)
	}
	items, err := readItems(o, stdin)
	if err != nil {
		return bad(err)
	}
	request, err := parseRequest(o.request)
	if err != nil {
		return bad(err)
	}
	for _, it := range items {
		it.job.Request = request
		it.job.Cost = o.cost
		if !o.deadline.IsZero() {
			it.job.Deadline = o.deadline.UTC()
		}
		if !o.notBefore.IsZero() {
			it.job.NotBefore = o.notBefore.UTC()
		}
	}
	p := newProgress(o.progress, stderr, len(items))
	s := &summary{Jobs: len(items)}
	runErr := send(ctx, c, o, items, pace, s, p)
	if runErr == nil && o.wait {
		runErr = waitDelivered(ctx, c, o, items, s, p)
	}
	p.done()
	s.Seconds = time.Since(start).Seconds()
	s.IDs = make([]string, len(items))
	for i, it := range items {
		if it.accepted {
			s.IDs[i] = it.result.Admission.ID
		}
	}
	runErr = conclude(ctx, o, items, s, runErr)
	if runErr != nil {
		s.Error = runErr.Error()
	}
	if o.wait {
		s.Outcomes = outcomes(items)
	}
	printSummary(stdout, o, s)
	return runErr
}

// schedule reads --not-before and --delay into o.notBefore: one time for
// every job and every try, as --expires-in's deadline (a job sent again
// after a 429 is not moved later).
func (o *options) schedule() error {
	switch {
	case o.notBeforeText != "" && o.delay != 0:
		return errors.New("--not-before and --delay together: give one (--not-before a time, --delay a duration from now)")
	case o.delay < 0:
		return fmt.Errorf("--delay %v: want a duration of 0 or more", o.delay)
	case o.delay > 0:
		o.notBefore = time.Now().Add(o.delay)
	case o.notBeforeText != "":
		t, err := time.Parse(time.RFC3339, o.notBeforeText)
		if err != nil {
			return fmt.Errorf("--not-before %q: want an RFC 3339 time such as 2026-12-08T09:00:00Z", o.notBeforeText)
		}
		o.notBefore = t
	}
	if !o.notBefore.IsZero() && !o.deadline.IsZero() && !o.deadline.After(o.notBefore) {
		return fmt.Errorf("--expires-in %v ends by the jobs' not-before time (%s): no job could be sent", o.expiresIn, o.notBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// conclude sets the run's exit status in s from how it went (runErr, and
// the jobs' answers) and returns the run's error: nil for exit 0.
func conclude(ctx context.Context, o options, items []*item, s *summary, runErr error) error {
	s.Exit = exitOK
	var ee exitError
	switch {
	case ctx.Err() != nil:
		s.Exit = exitInterrupted
		runErr = exitError{code: exitInterrupted, err: errors.New("interrupted: run the same command again to send the rest (nothing is sent twice)")}
	case errors.As(runErr, &ee):
		s.Exit = ee.code
	case runErr != nil:
		s.Exit = exitRefused
		runErr = exitError{code: exitRefused, err: runErr}
	case s.Rejected > 0:
		s.Exit = exitRejected
		msg := fmt.Sprintf("%d job(s) still refused after %d attempts each", s.Rejected-s.Impossible, o.maxAttempts)
		if s.Impossible > 0 {
			msg = fmt.Sprintf("%d job(s) refused for good (422: they would be sent after their deadline, cost more than the tenant's bucket holds, are further ahead than its schedule_horizon, or ask for a request their downstream does not allow; 429 schedule_full: the tenant has its max_scheduled jobs booked for later)%s", s.Impossible, firstRefusal(items))
			if s.Rejected > s.Impossible {
				msg += fmt.Sprintf("; %d still refused after %d attempts each", s.Rejected-s.Impossible, o.maxAttempts)
			}
		}
		runErr = exitError{code: exitRejected, err: errors.New(msg)}
	case o.wait && s.Delivered < s.Accepted:
		s.Exit = exitNotDelivered
		runErr = exitError{code: exitNotDelivered, err: fmt.Errorf("%d of %d job(s) not delivered (%d failed)", s.Accepted-s.Delivered, s.Accepted, s.Failed)}
	}
	return runErr
}

func printSummary(w io.Writer, o options, s *summary) {
	if o.asJSON {
		enc := json.NewEncoder(w)
		_ = enc.Encode(s)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d job(s) for tenant %s: %d accepted", s.Jobs, o.tenant, s.Accepted)
	if s.Duplicates > 0 {
		fmt.Fprintf(&b, " (%d already there)", s.Duplicates)
	}
	if s.Scheduled > 0 {
		fmt.Fprintf(&b, " (%d scheduled for later)", s.Scheduled)
	}
	fmt.Fprintf(&b, ", %d refused; %d request(s), %d Retry-After wait(s), %.1fs", s.Rejected, s.Requests, s.Waits, s.Seconds)
	if o.wait {
		fmt.Fprintf(&b, "; %d delivered, %d failed", s.Delivered, s.Failed)
		if s.Undelivered > 0 {
			fmt.Fprintf(&b, ", %d not finished after --wait-timeout", s.Undelivered)
		}
	}
	fmt.Fprintln(w, b.String())
	printOutcomes(w, s.Outcomes)
}
