package queue

import (
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
