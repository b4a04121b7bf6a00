package queue

import (
	"context"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// WriteNoter is a capability of a store that wants to hear when a claimed
// job's attempt writes its request, ahead of its outcome: the jobs behind
// a send that ran late are those not yet written (rules.Record.RunLate),
// and a busy machine records outcomes late.
type WriteNoter interface {
	Wrote(job Job)
}

// SharedGate is a capability of a store that several processes share: a
// check, in the store, that each send keeps the rate across all of them.
// The dispatcher asks it right before each write (a store without it paces
// in process only).
type SharedGate interface {
	PassGate(ctx context.Context, r GateRequest) (GateAnswer, error)
}

// GateRequest is one send asking the shared gate to go.
type GateRequest struct {
	Downstream, Tenant string
	Policy             leaky.Policy
	Ceiling            *leaky.Policy // nil: none (the downstream lane holds only)
	Cost               int
}

// GateAnswer is the shared gate's answer: go (both zero), wait, or held.
type GateAnswer struct {
	Wait      time.Duration
	HeldUntil time.Time
	// Again gives back a grant that will not be used (go only) and asks
	// again, in one round trip.
	Again func(context.Context) (GateAnswer, error)
	// Confirm (go only; nil: the gate needs none) tells the gate when the
	// grant's request was written: wroteAfter since the grant was asked
	// for, on the sender's clock (written false: it was not, and the grant
	// is given back). Until it is confirmed the gate grants its lanes to
	// no other send (for a second at most, in case the sender died), so a
	// write that came late cannot shorten the gap to the next.
	Confirm func(ctx context.Context, wroteAfter time.Duration, written bool) error
}
