// Package callback sends the callbacks that jobs' ends owe to their
// producers (DESIGN.md section 6b): a signed POST (Standard Webhooks, with
// a webhook-id of its own, the same on every attempt: MessageID) of the
// job as GET /v1/jobs/{id} shows it, retried with backoff and full jitter
// until a 2xx or callbacks.max_attempts. The store keeps what is owed
// (written with the job's final state: Store); a Sender takes what is due,
// sends it with its own bounded concurrency and client, and records how it
// went. It takes no slot of any rate and never touches the dispatcher's
// path: a slow or dead receiver costs only its own sends.
package callback

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// PollDefault is how often a Sender looks for callbacks due.
const PollDefault = 100 * time.Millisecond

// leaseMargin is added to an attempt's timeout for its lease: the time to
// sign it and record how it went.
const leaseMargin = 5 * time.Second

// Live is the [callbacks] section as the config now has it, with its
// signer (nil: callbacks are not configured; nothing is taken).
type Live func() (config.Callbacks, *outbound.Signer)

// Store is what a Sender needs of the job store: the callbacks owed, and
// a record of each attempt (queue.Store has both; see its docs).
type Store interface {
	DueCallbacks(ctx context.Context, limit int, lease time.Duration) ([]queue.Job, error)
	CallbackAttempted(ctx context.Context, id string, a queue.CallbackAttempt) error
}

var _ Store = queue.Store(nil)

// Options configure a Sender; zero values take defaults.
type Options struct {
	Store Store // required
	Live  Live  // required
	// Body is a callback's body for a job (required): the event as
	// DESIGN.md 6b gives it, built by the API's job shape.
	Body func(queue.Job) ([]byte, error)
	// Clock is the store's clock: retry times are written in it. Default
	// clock.Real.
	Clock clock.Clock
	// Client sends (default NewClient). Redirects are not followed: a 3xx
	// is not a delivery.
	Client *http.Client
	Logger *slog.Logger // default slog.Default()
	// OnAttempt is told each attempt's outcome: "delivered", "retry" or
	// "failed" (given up).
	OnAttempt func(outcome string)
	Poll      time.Duration // default PollDefault
	// Jitter returns a random number in [0, 1) (default math/rand/v2).
	Jitter func() float64
}

// Sender sends owed callbacks from Start until Stop.
type Sender struct {
	opts Options

	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan struct{}
	inFlight sync.WaitGroup
}

// New makes a Sender.
func New(opts Options) *Sender {
	opts.Clock = cmp.Or[clock.Clock](opts.Clock, clock.Real{})
	if opts.Client == nil {
		opts.Client = NewClient()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.OnAttempt == nil {
		opts.OnAttempt = func(string) {}
	}
	opts.Poll = cmp.Or(opts.Poll, PollDefault)
	if opts.Jitter == nil {
		opts.Jitter = rand.Float64
	}
	return &Sender{opts: opts}
}

// NewClient is a client of its own for callbacks: not the dispatcher's
// paced one, so that callbacks never wait at a vendor's gate and a dead
// receiver never holds the dispatcher's connections.
func NewClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Start begins sending. Safe to call once.
func (s *Sender) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go s.run(ctx)
}

// Stop stops taking callbacks, cuts short those being sent (each is taken
// again once its lease ends) and waits for them. Safe to call more than
// once, or without Start.
func (s *Sender) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return
	}
	s.cancel()
	<-s.done
	s.inFlight.Wait()
}

func (s *Sender) run(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(s.opts.Poll)
	defer tick.Stop()
	var slots chan struct{}
	limit := 0
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cfg, signer := s.opts.Live()
		if signer == nil {
			continue
		}
		if cfg.Concurrency != limit {
			// A reload changed it: a new pool; sends under way finish on
			// the old one.
			limit, slots = cfg.Concurrency, make(chan struct{}, cfg.Concurrency)
		}
		free := cap(slots) - len(slots)
		if free == 0 {
			continue
		}
		timeout := cfg.Timeout.Std()
		jobs, err := s.opts.Store.DueCallbacks(ctx, free, timeout+leaseMargin)
		if err != nil {
			if !failing && ctx.Err() == nil {
				s.opts.Logger.Error("cannot read the callbacks owed; trying again", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			s.opts.Logger.Info("callbacks owed can be read again")
			failing = false
		}
		for _, j := range jobs {
			pool := slots // the pool it is counted in, even if a reload makes another
			pool <- struct{}{}
			s.inFlight.Add(1)
			go func() {
				defer func() { <-pool; s.inFlight.Done() }()
				s.attempt(ctx, j, cfg, signer)
			}()
		}
	}
}

// attempt sends job j's callback once and records how it went. One cut
// short by Stop is not recorded: its lease ends and it is sent again.
func (s *Sender) attempt(ctx context.Context, j queue.Job, cfg config.Callbacks, signer *outbound.Signer) {
	attempts := 1
	if j.CallbackStatus != nil {
		attempts = j.CallbackStatus.Attempts + 1
	}
	var a queue.CallbackAttempt
	if !cfg.Allowed(j.Callback.URL) {
		a.Error = "callback_url is no longer in callbacks.allow (the config was reloaded): given up"
	} else {
		err := s.post(ctx, j, cfg.Timeout.Std(), signer)
		if err != nil && ctx.Err() != nil {
			return
		}
		a.Delivered = err == nil
		if err != nil {
			a.Error = err.Error()
			if attempts < cfg.MaxAttempts {
				a.Retry = s.opts.Clock.Now().Add(s.backoff(cfg, attempts))
			}
		}
	}
	outcome := queue.CallbackDelivered
	switch {
	case !a.Delivered && a.Retry.IsZero():
		outcome = queue.CallbackFailed
		s.opts.Logger.Warn("a callback was given up", "job", j.ID, "tenant", j.Tenant, "attempts", attempts, "last_error", a.Error)
	case !a.Delivered:
		outcome = "retry"
	}
	// Recorded even while stopping: the attempt was made.
	rec, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.opts.Store.CallbackAttempted(rec, j.ID, a); err != nil {
		// Its lease ends and it is sent again (the receiver drops the
		// repeat by its webhook-id).
		s.opts.Logger.Warn("cannot record a callback's attempt; it will be sent again", "job", j.ID, "err", err)
	}
	s.opts.OnAttempt(outcome)
}

// post sends the callback: nil on a 2xx.
func (s *Sender) post(ctx context.Context, j queue.Job, timeout time.Duration, signer *outbound.Signer) error {
	body, err := s.opts.Body(j)
	if err != nil {
		return fmt.Errorf("cannot build the callback's body: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.Callback.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("callback_url cannot be requested: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "throttler-callback")
	signer.Sign(req.Header, MessageID(j), body, time.Now())
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return sendError(err, timeout)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection is reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %d", resp.StatusCode)
	}
	return nil
}

// MessageID is the webhook-id of the callback of job j's end: the same on
// every attempt of that callback (the receiver drops a resend as a
// repeat), never the job id alone (the id a signed delivery of the same
// job carries: a service that is both the vendor and the producer would
// drop the callback as a repeat of the delivery), and new for a later end
// of the job after a hand retry (Standard Webhooks: one id per message).
// The end is the job's finish time, which a retry clears and the next end
// sets anew; both stores keep it to the microsecond.
func MessageID(j queue.Job) string {
	return "cb_" + j.ID + "_" + strconv.FormatInt(j.FinishedAt.UnixMicro(), 36)
}

// sendError says why a request got no answer, without its URL (which
// may carry a token of the producer's).
func sendError(err error, timeout time.Duration) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer within callbacks.timeout (%v)", timeout)
	}
	return fmt.Errorf("no answer: %w", err)
}

// backoff is the wait before attempt n+1, after n attempts: full jitter,
// a random wait up to min_backoff doubled per attempt, capped at
// max_backoff.
func (s *Sender) backoff(cfg config.Callbacks, n int) time.Duration {
	ceiling := cfg.MinBackoff.Std()
	for i := 1; i < n && ceiling < cfg.MaxBackoff.Std(); i++ {
		ceiling *= 2
	}
	return time.Duration(s.opts.Jitter() * float64(min(ceiling, cfg.MaxBackoff.Std())))
}
