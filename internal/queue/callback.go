package queue

import (
	"context"
	"slices"
	"time"
)

// JobCallback is where a job's end is told to its producer (DESIGN.md
// section 6b): a signed POST to URL when the job reaches one of On.
type JobCallback struct {
	URL string `json:"url"`
	// On are the final states told (nil: all four).
	On []JobState `json:"on,omitempty"`
}

// FinalStates are the states a job ends in, the ones a callback can tell.
var FinalStates = []JobState{StateSucceeded, StateFailed, StateExpired, StateCancelled}

// Owed reports whether a job that ended in st owes this callback.
func (c *JobCallback) Owed(st JobState) bool {
	if c == nil || c.URL == "" || !st.Finished() {
		return false
	}
	return len(c.On) == 0 || slices.Contains(c.On, st)
}

// Callback states.
const (
	CallbackPending   = "pending"   // owed: sent until a 2xx or its attempts run out
	CallbackDelivered = "delivered" // the receiver answered 2xx
	CallbackFailed    = "failed"    // every attempt failed: given up
)

// CallbackStatus is the callback a job's end owes, and how it went.
type CallbackStatus struct {
	State     string    `json:"state"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	NextAt    time.Time `json:"next_at,omitzero"` // pending: the next attempt, no earlier
}

// CallbackAttempt is how one attempt at a callback went.
type CallbackAttempt struct {
	Delivered bool
	Error     string // what went wrong (not delivered)
	// Retry is when to try again; zero gives up (CallbackFailed).
	Retry time.Time
}

// CallbackStore is a capability of a store that keeps the callbacks jobs'
// ends owe (both stores have it). A callback is owed in the same write as
// the final state it tells, so a crash between the two cannot lose it.
type CallbackStore interface {
	// DueCallbacks takes up to limit owed callbacks due by now, each for
	// one attempt: none is handed out again for lease (a process that
	// dies while sending leaves it to be taken again then). Each job comes
	// with its Callback and CallbackStatus, and without its payload.
	DueCallbacks(ctx context.Context, limit int, lease time.Duration) ([]Job, error)
	// CallbackAttempted records an attempt at job id's callback.
	CallbackAttempted(ctx context.Context, id string, a CallbackAttempt) error
}
