package client

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// RetryPolicy says when a failed call is worth making again, and after how
// long. The zero value takes the defaults below.
type RetryPolicy struct {
	// MaxAttempts bounds the calls, the first included. Default 5.
	MaxAttempts int
	// MaxWait is the longest one wait may be: a Retry-After beyond it ends
	// the retries (the error is returned) rather than sleep that long.
	// Default 1 minute.
	MaxWait time.Duration
	// BaseBackoff and MaxBackoff bound the exponential backoff (full
	// jitter) after an error that says nothing of when to come back: no
	// answer, or a 5xx. Defaults 250 ms and 30 s.
	BaseBackoff, MaxBackoff time.Duration
}

// Defaults of RetryPolicy.
const (
	DefaultMaxAttempts = 5
	DefaultMaxWait     = time.Minute
	DefaultBaseBackoff = 250 * time.Millisecond
	DefaultMaxBackoff  = 30 * time.Second
)

// Delay says whether a call that failed with err, its attempt-th (from 1),
// is worth making again, and after how long:
//   - refused for now (*QueueFullError, *RateLimitedError), or unavailable
//     with a Retry-After (*UnavailableError): after RetryAfter plus jitter
//     (up to 10% of it, 10 ms to 1 s), so that producers told the same
//     instant do not come back together;
//   - no answer (*UnreachableError), a 5xx, or a 503 without Retry-After:
//     after an exponential backoff with full jitter;
//   - anything else (refused for good, malformed, not allowed, the context
//     done): not at all. That includes *ScheduleFullError, a 429 that
//     names no time to come back: its tenant's booked jobs free room only
//     as they reach their slots, hours or days ahead maybe.
func (p RetryPolicy) Delay(err error, attempt int) (time.Duration, bool) {
	if err == nil || attempt >= cmp.Or(p.MaxAttempts, DefaultMaxAttempts) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return 0, false
	}
	var (
		full  *QueueFullError
		rated *RateLimitedError
		unav  *UnavailableError
		api   *APIError
	)
	var wait time.Duration
	switch {
	case errors.As(err, &full), errors.As(err, &rated), errors.As(err, &unav) && unav.RetryAfter > 0:
		errors.As(err, &api)
		wait = api.RetryAfter + p.Jitter(api.RetryAfter)
	case IsUnreachable(err), errors.As(err, &api) && api.Status >= 500:
		wait = p.Backoff(attempt)
	default:
		return 0, false
	}
	if wait > cmp.Or(p.MaxWait, DefaultMaxWait) {
		return 0, false
	}
	return wait, true
}

// Jitter is what Delay adds to a Retry-After of d: uniform in [0, d/10],
// the bound kept within 10 ms and 1 s.
func (p RetryPolicy) Jitter(d time.Duration) time.Duration {
	spread := min(time.Second, max(10*time.Millisecond, d/10))
	return time.Duration(rand.Int64N(int64(spread) + 1))
}

// Backoff is the wait after the attempt-th failure with no word of when to
// come back: uniform in [0, min(MaxBackoff, BaseBackoff * 2^(attempt-1))],
// at least 50 ms ("full jitter").
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	base, ceiling := cmp.Or(p.BaseBackoff, DefaultBaseBackoff), cmp.Or(p.MaxBackoff, DefaultMaxBackoff)
	bound := ceiling
	if attempt >= 1 && attempt < 32 && base<<(attempt-1) > 0 {
		bound = min(ceiling, base<<(attempt-1))
	}
	return max(50*time.Millisecond, time.Duration(rand.Int64N(int64(bound)+1)))
}

// Retry calls fn until it succeeds, fails in a way Delay does not retry,
// runs out of attempts, or ctx is done, waiting between calls as p.Delay
// says. It returns fn's last result.
func Retry[T any](ctx context.Context, p RetryPolicy, fn func(context.Context) (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := fn(ctx)
		wait, again := p.Delay(err, attempt)
		if !again || ctx.Err() != nil {
			return v, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}
