package queue

import (
	"errors"
	"fmt"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
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
	// The tenant has max_scheduled jobs booked for later: room comes as
	// they go, at no time a Retry-After could name.
	ReasonScheduleFull = "schedule_full"
)

// Reasons a job is impossible (422).
const (
	ReasonWouldExpire  = "would_expire"   // it would be sent after its deadline
	ReasonCostTooLarge = "cost_too_large" // more slots than the bucket ever holds
	ReasonTooFarAhead  = "too_far_ahead"  // its not_before is past the tenant's schedule_horizon
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
	// too_far_ahead: its not_before, and how far ahead the tenant may book.
	NotBefore time.Time
	Horizon   time.Duration
}

func (e *ImpossibleError) Error() string {
	switch e.Reason {
	case ReasonCostTooLarge:
		return fmt.Sprintf("tenant %s: a job of cost %d can never be admitted: at most %d (capacity + burst, and every window)", e.Tenant, e.Cost, e.MaxCost)
	case ReasonTooFarAhead:
		return fmt.Sprintf("tenant %s: not_before %s is more than its schedule_horizon (%v) ahead: send it later, or raise schedule_horizon", e.Tenant, e.NotBefore.UTC().Format(time.RFC3339Nano), e.Horizon)
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
	// schedule_full: the jobs booked for later, and the tenant's bound.
	Scheduled, MaxScheduled int
}

func (e *RejectedError) Error() string {
	if e.Reason == ReasonScheduleFull {
		return fmt.Sprintf("tenant %s: %d jobs are scheduled for later, its max_scheduled: send again once some have gone, or raise max_scheduled", e.Tenant, e.Scheduled)
	}
	return fmt.Sprintf("tenant %s: %s; retry after %v", e.Tenant, e.Reason, e.RetryAfter)
}

// ScheduleFull is the refusal of a job booked for later while the tenant
// has max_scheduled of them.
func ScheduleFull(tenant string, scheduled, most int) *RejectedError {
	return &RejectedError{Tenant: tenant, Reason: ReasonScheduleFull, Scheduled: scheduled, MaxScheduled: most}
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
func Rejection(tenant string, p leaky.Policy, retryAfter time.Duration, depth int) *RejectedError {
	reason := ReasonQueueFull
	if p.Capacity == 0 {
		reason = ReasonRateLimited
	}
	return &RejectedError{Tenant: tenant, Reason: reason, RetryAfter: retryAfter, QueueDepth: depth, Capacity: p.Capacity}
}

// Unavailable wraps err (if not nil) as ErrUnavailable: the store could not
// be reached or could not write, and nothing of the call happened.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// StoreFullError is a job refused because the store's disk has less room
// than the reserve kept for what must go on when it is full: outcomes,
// cancels, the maintainer (DESIGN.md 6c). Nothing of the call happened.
// Admissions come back by themselves once there is room again: deliveries
// free their jobs' payloads, or an operator frees the disk.
type StoreFullError struct {
	Path       string // where the store is
	Free       int64  // bytes of room when refused
	Reserve    int64  // store.reserve
	RetryAfter time.Duration
	// Redis, set instead of Path, Free and Reserve, is a Redis's refusal
	// of a write for its maxmemory (its OOM error, as it said it): on
	// Redis the room that runs out is memory, and an operator looking at
	// the answer must be told which setting it is.
	Redis string
}

// MaxmemoryError is the refusal of a write by a Redis at its maxmemory:
// msg is Redis's OOM error. Nothing of the call happened (a script is
// refused at its first write, never halfway).
func MaxmemoryError(msg string) *StoreFullError {
	return &StoreFullError{Redis: msg, RetryAfter: fullRetryAfter}
}

// fullRetryAfter is how soon a client refused for a full store is told to
// try again: room comes back as deliveries free it or an operator acts,
// not within the second a 503 suggests.
const fullRetryAfter = 2 * time.Second

func (e *StoreFullError) Error() string {
	if e.Redis != "" {
		return fmt.Sprintf("the job store is full: Redis refuses writes at its maxmemory (%s); new jobs are refused until it has room: raise maxmemory (CONFIG SET maxmemory), or free memory in Redis", e.Redis)
	}
	return fmt.Sprintf("the job store is full: %s has %s of room, under store.reserve (%s) kept for deliveries' outcomes; new jobs are refused until there is room again (delivered jobs free theirs)",
		e.Path, Bytes(e.Free), Bytes(e.Reserve))
}

// Bytes formats a size for people: "63.9 MiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, s := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}

// Space is what a store whose room can run out (the embedded store's
// disk) says of it: an optional capability, read by /readyz and /metrics.
type Space interface {
	// Room is the store's room now; Full means admissions are refused.
	Room() SpaceStatus
}

// Ownership is what a store whose tenants are sent by whichever process
// holds their partition (Redis) says of it: an optional capability, read
// by /metrics. A partition no live process holds sends nothing.
type Ownership interface {
	// Held is how many partitions this process holds, of how many.
	Held() (held, partitions int)
}

// SpaceStatus is a store's room: free bytes (the filesystem's, and what
// the store's file has free for reuse), the reserve, and whether
// admissions are refused for it (then Err says why).
type SpaceStatus struct {
	Free, Reserve int64
	Full          bool
	Err           *StoreFullError
}
