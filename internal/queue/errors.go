package queue

import (
	"errors"
	"fmt"
	"time"

	"throttler/internal/leaky"
)

var (
	// ErrNotFound: no such job.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the store cannot be reached or cannot write.
	ErrUnavailable = errors.New("store unavailable")
)

// Rejection reasons.
const (
	ReasonQueueFull   = "queue_full"   // leaky: the queue holds capacity jobs
	ReasonRateLimited = "rate_limited" // token: no token left
)

// Reasons a job is impossible (422).
const (
	ReasonWouldExpire  = "would_expire"   // it would be sent after its deadline
	ReasonCostTooLarge = "cost_too_large" // more slots than the bucket ever holds
)

// ImpossibleError is a job refused because it asks what the queue cannot
// do: waiting and retrying would not help.
type ImpossibleError struct {
	Tenant string
	Reason string // ReasonWouldExpire or ReasonCostTooLarge
	// would_expire: the wait it would have had, and its deadline.
	ExpectedDelay time.Duration
	Deadline      time.Time
	// cost_too_large: its cost and the most the tenant's bucket allows.
	Cost, MaxCost int
}

func (e *ImpossibleError) Error() string {
	if e.Reason == ReasonCostTooLarge {
		return fmt.Sprintf("tenant %s: a job of cost %d can never be admitted: at most %d (capacity + burst, and every window)", e.Tenant, e.Cost, e.MaxCost)
	}
	return fmt.Sprintf("tenant %s: the job would wait %v and be sent after its deadline %s", e.Tenant, e.ExpectedDelay.Round(time.Millisecond), e.Deadline.UTC().Format(time.RFC3339Nano))
}

// RejectedError is a job refused because the tenant has no room.
type RejectedError struct {
	Tenant     string
	Reason     string // ReasonQueueFull or ReasonRateLimited
	RetryAfter time.Duration
	QueueDepth int
	Capacity   int
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("tenant %s: %s; retry after %v", e.Tenant, e.Reason, e.RetryAfter)
}

// StateError is an operation refused because of the job's state.
type StateError struct {
	ID    string
	State JobState
	Op    string
}

func (e *StateError) Error() string {
	return fmt.Sprintf("job %s is %s: cannot %s it", e.ID, e.State, e.Op)
}

// Rejection is the refusal of a job the bucket has no room for.
func Rejection(tenant string, p leaky.Policy, d leaky.Decision, depth int) *RejectedError {
	reason := ReasonQueueFull
	if p.Capacity == 0 {
		reason = ReasonRateLimited
	}
	return &RejectedError{Tenant: tenant, Reason: reason, RetryAfter: d.RetryAfter, QueueDepth: depth, Capacity: p.Capacity}
}

// Unavailable wraps err (if not nil) as ErrUnavailable: the store could not
// be reached or could not write, and nothing of the call happened.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}
