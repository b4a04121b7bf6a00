package handler

import (
	"errors"
	"fmt"
	"time"
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

// Kind is what a handler's error decides.
type Kind int

const (
	Succeeded  Kind = iota // nil
	Retried                // any other error: retried with backoff
	PushedBack             // a *PushbackError
	Failed                 // a *PermanentError
	Cancelled              // a *CancelError
)

// Decide is the one function that maps a handler's error onto what
// happens to the job, and for a pushback how long the tenant pauses.
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
	return Retried, 0
}
