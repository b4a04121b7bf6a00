package handler

import (
	"errors"
	"fmt"
	"time"

	"github.com/throttler-dev/throttler/internal/dispatch"
	"github.com/throttler-dev/throttler/internal/queue"
)

// PushbackError asks throttler to pause the job's tenant for After, as a
// 429 with Retry-After does: the job keeps its place and goes first when
// the pause ends, and no attempt is used up. (river's JobSnooze.)
type PushbackError struct {
	After time.Duration
	Err   error
}

func (e *PushbackError) Error() string {
	return fmt.Sprintf("pushback for %v: %v", e.After, e.Err)
}
func (e *PushbackError) Unwrap() error { return e.Err }

// PermanentError fails the job at once, with no retry. (asynq's
// SkipRetry, river's JobCancel.)
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// CancelError ends the job cancelled: it is not to be done. (asynq's
// RevokeTask.)
type CancelError struct{ Err error }

func (e *CancelError) Error() string { return e.Err.Error() }
func (e *CancelError) Unwrap() error { return e.Err }

// Pushback returns an error that pauses the job's tenant for after (at
// least one interval of its rate; 0: throttler's backoff). err says why
// (nil: "pushed back").
func Pushback(after time.Duration, err error) error {
	if err == nil {
		err = errors.New("pushed back")
	}
	return &PushbackError{After: after, Err: err}
}

// Permanent returns an error that fails the job without a retry.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("failed permanently")
	}
	return &PermanentError{Err: err}
}

// Cancel returns an error that ends the job cancelled.
func Cancel(err error) error {
	if err == nil {
		err = errors.New("cancelled by the handler")
	}
	return &CancelError{Err: err}
}

// Kind is what a handler's error decides for its job: each is named as
// the outcome the job's attempt records, with the same meaning (Decide
// has the table).
type Kind int

const (
	Succeeded  Kind = iota // nil: the job succeeded
	Retry                  // any other error: a failure, retried with backoff
	PushedBack             // a *PushbackError: retried after the tenant's pause
	Failed                 // a *PermanentError: failed for good, not retried
	Cancelled              // a *CancelError: cancelled, not to be done
)

// Retried is Retry.
//
// Deprecated: use Retry, the outcome's own name.
const Retried = Retry

// String names a Kind.
func (k Kind) String() string {
	switch k {
	case Succeeded:
		return "succeeded"
	case Retry:
		return "retry"
	case PushedBack:
		return "pushed back"
	case Failed:
		return "failed"
	case Cancelled:
		return "cancelled"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Decide is the one function that maps a handler's error onto the job's
// outcome, and for a pushback how long the tenant pauses:
//
//	the error        Kind        the job, as for an HTTP answer
//	nil              Succeeded   succeeded (a 2xx)
//	any other        Retry       retried with backoff, counting toward
//	                             max_attempts and the breaker (a 5xx)
//	*PushbackError   PushedBack  retried once the tenant's pause of After
//	                             ends (0: the backoff), keeping its place,
//	                             using up no attempt (a 429, Retry-After)
//	*PermanentError  Failed      failed for good, not retried (a 4xx)
//	*CancelError     Cancelled   cancelled: not to be done, not retried
//
// A panic and the downstream's timeout end the attempt as Retry does.
// Errors are matched with errors.As, so a wrapped one decides too; the
// first of cancel, permanent and pushback found wins.
func Decide(err error) (Kind, time.Duration) {
	var c *CancelError
	var p *PermanentError
	var pb *PushbackError
	switch {
	case err == nil:
		return Succeeded, 0
	case errors.As(err, &c):
		return Cancelled, 0
	case errors.As(err, &p):
		return Failed, 0
	case errors.As(err, &pb):
		return PushedBack, max(pb.After, 0)
	}
	return Retry, 0
}

// reply is Decide's answer as the dispatcher takes it: each Kind is the
// queue.Result of its name, and PushedBack a Retry that pauses.
func reply(body []byte, err error) dispatch.Reply {
	kind, after := Decide(err)
	r := dispatch.Reply{Body: body}
	if err != nil {
		r.Error = err.Error()
	}
	switch kind {
	case Succeeded:
		r.Result = queue.Succeeded
	case PushedBack:
		r.Result, r.Pushback, r.After = queue.Retry, true, after
	case Failed:
		r.Result = queue.Failed
	case Cancelled:
		r.Result = queue.Cancelled
	default:
		r.Result = queue.Retry
	}
	return r
}
