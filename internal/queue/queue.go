// Package queue owns the seam between the service and its stores: the Store
// interface that the API and the dispatcher use, its types and typed
// errors, and the rules every backend shares (a tenant's record and its
// windows, what an attempt's outcome does, dispatch time under a pause, the
// cost bound, the pre-check of a batch). Nothing here is backend-specific:
// the embedded store is queue/bolt, the Redis one queue/redis, and both pass
// the conformance suite in queue/queuetest.
//
// A job's life:
//
//	scheduled ──claim──┐
//	queued ──claim──▶ dispatching ──2xx──▶ succeeded
//	  ▲  │                 │ ──4xx, or last attempt──▶ failed
//	  │  └─cancel─▶ cancelled
//	  └──retrying ◀──5xx, timeout, connection error
//
// A store decides admission with internal/leaky under its own clock, keeps
// every admitted job durably before answering, and hands due jobs to a
// Handler a little before their slot.
package queue

import (
	"context"
	"encoding/json"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// JobState is where a job is in its life.
type JobState string

const (
	StateQueued      JobState = "queued"      // waiting for its slot
	StateScheduled   JobState = "scheduled"   // booked at its not_before, outside the queue's capacity
	StateDispatching JobState = "dispatching" // handed to the dispatcher: being sent
	StateRetrying    JobState = "retrying"    // waiting for the slot of its next attempt
	StateSucceeded   JobState = "succeeded"
	StateFailed      JobState = "failed"
	StateCancelled   JobState = "cancelled"
	StateExpired     JobState = "expired" // its deadline came before it could be sent
)

// EffectiveSlot is the job's place in its tenant's schedule (jobs stored
// before pauses existed have only DispatchAt, which was their slot).
func (j Job) EffectiveSlot() time.Time {
	if j.Slot.IsZero() {
		return j.DispatchAt
	}
	return j.Slot
}

// Waiting reports whether a job in this state waits for a slot.
func (s JobState) Waiting() bool {
	return s == StateQueued || s == StateRetrying || s == StateScheduled
}

// Finished reports whether a job in this state is done for good.
func (s JobState) Finished() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled || s == StateExpired
}

// Job is one unit of work for a tenant's downstream.
type Job struct {
	ID             string          `json:"id"`
	Tenant         string          `json:"tenant"`
	State          JobState        `json:"state"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	// Attempts counts attempts begun (a claim is an attempt).
	Attempts   int       `json:"attempts"`
	EnqueuedAt time.Time `json:"enqueued_at"`
	// DispatchAt is the real time of the next attempt (or of the last one):
	// Slot plus the tenant's pauses so far.
	DispatchAt time.Time `json:"dispatch_at"`
	// Slot is that attempt's place in the tenant's schedule, in tenant time
	// (see leaky.Pause): a pause moves DispatchAt, never Slot.
	Slot time.Time `json:"slot,omitzero"`
	// Failures counts failed attempts (5xx, timeouts, connection errors):
	// max_attempts bounds these. Pushback (429, 503 with Retry-After) and
	// jobs held back by an open circuit breaker do not count.
	Failures int `json:"failures,omitempty"`
	// Cost is how many slots of the schedule the job takes (1 if zero).
	Cost int `json:"cost,omitempty"`
	// Deadline: after it, the job is worthless and is never sent (zero:
	// none).
	Deadline time.Time `json:"deadline,omitzero"`
	// NotBefore is the time a scheduled job was booked at or after (zero:
	// it was admitted into the queue, its not_before if it had one passed
	// by its place there).
	NotBefore time.Time `json:"not_before,omitzero"`
	// SentAt is when the last attempt's request was written.
	SentAt         time.Time `json:"sent_at,omitzero"`
	FinishedAt     time.Time `json:"finished_at,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	ResponseStatus int       `json:"response_status,omitempty"`
	// What the job was told at admission, told again for a repeated key.
	AdmitDelay time.Duration `json:"admit_delay"`
	AdmitDepth int           `json:"admit_depth"`
	// Prompt: the bucket had room to send it at once (it waited only for
	// the time a send takes to start).
	Prompt bool `json:"prompt,omitempty"`
	// Request is what the job asks of its downstream's request (method,
	// path, query, headers), checked against the downstream at admission;
	// nil: the downstream's own.
	Request *JobRequest `json:"request,omitempty"`
	// Response is the downstream's answer to the latest attempt, as much
	// of it as the downstream keeps (nil: no answer yet).
	Response *Response `json:"response,omitempty"`
	// Type is the job's kind, for a downstream that is a Go handler (an
	// asynq task's type); "" for none. Kept with the job, never sent over
	// HTTP.
	Type string `json:"type,omitempty"`
	// Callback is where its end is told (nil: nowhere).
	Callback *JobCallback `json:"callback,omitempty"`
	// CallbackStatus is the callback its end owed (nil: none owed yet).
	CallbackStatus *CallbackStatus `json:"callback_status,omitempty"`
}

// EffectiveCost is the job's cost, 1 by default.
func (j Job) EffectiveCost() int { return max(j.Cost, 1) }

// NewJob is a job as a producer sends it.
type NewJob struct {
	Payload        json.RawMessage
	IdempotencyKey string
	// Cost: slots of the schedule it takes (0 or 1: one).
	Cost int
	// Deadline: refuse the job if it cannot be sent by then; expire it if a
	// pause pushes it past (zero: none).
	Deadline time.Time
	// NotBefore: the job is not sent before then (zero: as soon as its
	// place in the queue comes). Later than that place, it is booked
	// there, outside the queue's capacity (StateScheduled).
	NotBefore time.Time
	// Request: what the job asks of its downstream's request (nil: the
	// downstream's own). The API checks it against the downstream before
	// the job reaches the store.
	Request *JobRequest
	// Type: the job's kind for a Go handler ("": none; Job.Type).
	Type string
	// Callback: where its end is told (nil: nowhere; Job.Callback).
	Callback *JobCallback
}

// Admission is the answer to one NewJob: admitted (Job set, Rejected and
// Impossible nil), a repeat of an earlier idempotency key (Duplicate, the
// first job and the first answer), refused for now (Rejected: the queue is
// full), or refused for good (Impossible: it asks what the queue cannot do).
type Admission struct {
	Job           Job
	Duplicate     bool
	ExpectedDelay time.Duration
	QueueDepth    int
	Capacity      int
	Rejected      *RejectedError
	Impossible    *ImpossibleError
	// LimitedBy, set by the API (stores leave it empty), says that a cap
	// on attempts in flight binds: ExpectedDelay is then an estimate from
	// the downstream's recent latency (rules.LimitInFlight).
	LimitedBy string
	// AsOf is the moment the store decided the job as of: its decision
	// time plus the start lag it scheduled with (zero: the store does not
	// say). The tenant's next decision is made as of this moment or later,
	// so room counted from here is room the next call finds.
	AsOf time.Time
}

// Admitted reports whether the job was taken (now, or by an earlier call
// with its idempotency key).
func (a Admission) Admitted() bool { return a.Rejected == nil && a.Impossible == nil }

// TenantStatus is what a store knows of one tenant.
type TenantStatus struct {
	Tenant        string
	QueueDepth    int // admitted, not yet handed to the downstream
	Scheduled     int // booked at their not_before, not counted in QueueDepth
	InFlight      int // being sent
	ExpectedDelay time.Duration
	// LimitedBy is which limit binds ExpectedDelay (rules.LimitOf).
	LimitedBy string
	Accepted  int64
	Rejected  int64
	Delivered int64
	Failed    int64
	Cancelled int64
	Expired   int64
	// Paused: nothing of the tenant is sent now. PausedUntil is when that
	// ends (zero for an operator hold, which ends on Resume); Held says an
	// operator paused it.
	Paused      bool
	PausedUntil time.Time
	Held        bool
	// OwnerAt, on a store many workers share (Redis): the tenant's
	// partition has no owner until then (held vacant on a new Redis), so
	// nothing of it is sent before; ExpectedDelay counts it. Zero: it has
	// one.
	OwnerAt time.Time
}

// Result is how an attempt ended: the one vocabulary from a downstream's
// answer, or a Go handler's reply (dispatch.Reply, and the public
// handler.Kind of the same names), to the store.
type Result int

const (
	// Succeeded: the downstream took it (2xx).
	Succeeded Result = iota + 1
	// Failed: for good (a permanent error, or the last attempt).
	Failed
	// Retry: send again. Without PauseUntil it is a failure: the job takes
	// a new slot no earlier than Outcome.NotBefore, paced like any attempt,
	// and the failure counts. With PauseUntil it is pushback: the job keeps
	// its slot and the tenant pauses (see Outcome.PauseUntil).
	Retry
	// Released: nothing was sent (the service is stopping, the tenant was
	// paused meanwhile, the circuit breaker is open); the job goes back to
	// waiting at its slot and the attempt is not counted.
	Released
	// Expired: nothing was sent, the job's deadline came first.
	Expired
	// Cancelled: the downstream (a Go handler returning asynq.RevokeTask,
	// or the handler package's Cancel) says the job is not to be done:
	// it ends cancelled, as a cancel on request would, and is not retried.
	Cancelled
)

// Outcome is what a Handler reports for one job.
type Outcome struct {
	Result Result
	// SentAt is when the request was written (zero if it was not).
	SentAt time.Time
	// Status is the downstream's HTTP status (0 if none).
	Status int
	// Error says what went wrong, for people (Failed, Retry).
	Error string
	// NotBefore is the earliest next attempt (Retry; Released, where a
	// store may honour it: the shared gate was busy until then).
	NotBefore time.Time
	// PauseUntil pauses the tenant (Retry, Released): tenant time stands
	// still from this job's slot until then, so this job goes first when the
	// pause ends and the others follow at their spacing.
	PauseUntil time.Time
	// PauseDownstream: the pause is the downstream's too (its account-wide
	// limit was hit): its ceiling sends nothing for any tenant until
	// PauseUntil, across a restart.
	PauseDownstream bool
	// Response is what is kept of the downstream's answer (nil: none came).
	// Stores keep the latest attempt's with the job.
	Response *Response
}

// Handler sends one due job and says how it went. It is called a little
// before job.DispatchAt and must wait for the slot itself. ctx is done when
// the service stops: a handler that has not sent yet returns Released.
type Handler func(ctx context.Context, job Job) Outcome

// ConsumeOptions tune Consume; zero values take the defaults.
type ConsumeOptions struct {
	// Lead is how long before its slot a job is handed over, so that the
	// handler can connect and be ready to write at the slot.
	// Default DefaultLead.
	Lead time.Duration
	// Concurrency caps jobs handed over and not yet finished. Default 1024.
	Concurrency int
}

// DefaultLead covers a store write and a connection setup.
const DefaultLead = 100 * time.Millisecond

// PolicyFunc gives the bucket policy of a tenant (config can change it).
type PolicyFunc func(tenant string) leaky.Policy

// CeilingFunc gives a tenant's downstream and that downstream's ceiling
// (nil: none): its account-wide limit across all its tenants.
type CeilingFunc func(tenant string) (downstream string, ceiling *leaky.Policy)

// Caps are the limits on a tenant's attempts in flight (DESIGN.md 6e): an
// attempt is in flight from its hand-over to the sender until its outcome
// is recorded, and none is handed over while a cap is reached.
type Caps struct {
	Downstream string
	Tenant     int // the tenant's max_in_flight (0: none)
	Shared     int // its downstream's, across all its tenants (0: none)
	// Timeout is the downstream's: how long an attempt written before a
	// crash may still be open at the vendor.
	Timeout time.Duration
}

// Capped reports whether either cap is set.
func (c Caps) Capped() bool { return c.Tenant > 0 || c.Shared > 0 }

// CapsFunc gives a tenant's caps (config can change them).
type CapsFunc func(tenant string) Caps

// Store keeps jobs and bucket state. All methods are safe for concurrent use.
// It is what both backends provide; what only one of them can do is an
// optional capability, found by type assertion: PolicyListener and
// SharedGate (Redis), Space (the embedded store).
type Store interface {
	// Enqueue decides each job in order, atomically with respect to every
	// other decision for the tenant, and returns once the admitted ones are
	// durable. A store failure fails the whole call (nothing is admitted)
	// with an error wrapping ErrUnavailable.
	Enqueue(ctx context.Context, tenant string, jobs []NewJob) ([]Admission, error)
	// Job returns a job by id (ErrNotFound).
	Job(ctx context.Context, id string) (Job, error)
	// Cancel cancels a waiting job. A job being sent or finished gives a
	// *StateError.
	Cancel(ctx context.Context, id string) (Job, error)
	// Retry sends a failed job again through its tenant's queue: it takes a
	// slot like a new job (so it can be refused: Admission.Rejected) and
	// gets its attempts afresh. A job not failed gives a *StateError.
	Retry(ctx context.Context, id string) (Admission, error)
	// Pause holds a tenant (operator): nothing more of it is handed to the
	// dispatcher until Resume; it keeps accepting while it has room.
	Pause(ctx context.Context, tenant string) (TenantStatus, error)
	// Resume ends an operator hold: the queue goes on at its spacing.
	Resume(ctx context.Context, tenant string) (TenantStatus, error)
	// Failed lists a tenant's failed jobs (kept for store.retention),
	// newest first, at most limit.
	Failed(ctx context.Context, tenant string, limit int) ([]Job, error)
	// Tenant reports one tenant (a tenant never seen reports zeros).
	Tenant(ctx context.Context, tenant string) (TenantStatus, error)
	// Tenants lists tenants with jobs waiting or in flight, deepest first.
	Tenants(ctx context.Context, offset, limit int) ([]TenantStatus, error)
	// Consume hands due jobs to h until ctx is done, then waits for the
	// handlers it started and records their outcomes before returning.
	Consume(ctx context.Context, h Handler, opts ConsumeOptions) error
	// WatchFinish returns a channel closed when job id may have reached a
	// final state (the caller reads the job to know), and stop, which the
	// caller calls once it no longer waits; a watch costs nothing while
	// nobody waits. It is what GET /v1/jobs/{id}?wait answers by instead
	// of polling. A notice can be lost (a dropped connection to a shared
	// store): a caller that waits long reads the job again now and then.
	WatchFinish(id string) (<-chan struct{}, func())
	// DueCallbacks takes up to limit owed callbacks due by now, each for
	// one attempt: none is handed out again for lease (a process that
	// dies while sending leaves it to be taken again then). Each job comes
	// with its Callback and CallbackStatus, and without its payload. A
	// callback is owed in the same write as the final state it tells, so
	// a crash between the two cannot lose it.
	DueCallbacks(ctx context.Context, limit int, lease time.Duration) ([]Job, error)
	// CallbackAttempted records an attempt at job id's callback: delivered,
	// to be tried again at a.Retry, or given up (CallbackFailed).
	CallbackAttempted(ctx context.Context, id string, a CallbackAttempt) error
	// Clock is the clock the store's times are in (DispatchAt, SentAt,
	// deadlines, a callback's NextAt): the dispatcher waits for dispatch
	// times and stamps writes on it, and the callback sender writes retry
	// times in it. The embedded store's is its own (the machine's in the
	// service); Redis's is TIME as this process reads it, the one clock of
	// all the processes that share it.
	Clock() clock.Clock
	// Ping reports whether the store can be reached.
	Ping(ctx context.Context) error
	Close() error
}

// PolicyListener is a capability of a store that holds jobs back by its
// tenants' policies ahead of the dispatcher (Redis's owners claim a
// tenant's backlog at its rate, reading the gate ahead): it is told when
// the policies its PolicyFunc reads have changed (a reload), so that a
// faster rate or a larger burst lets them go when the new policy does,
// not when the old one would have.
type PolicyListener interface{ PoliciesChanged() }

// Policies keeps tenants' policies as the API sets them (config.PolicyLayer,
// as JSON), so that they survive restarts and, on Redis, reach every
// process. Both stores keep them.
type Policies interface {
	// PutPolicy keeps tenant's layer; it returns once it is durable, with
	// the change it is (PolicyChanges; 0 on a store one process uses).
	PutPolicy(ctx context.Context, tenant string, layer []byte) (uint64, error)
	// DropPolicy forgets tenant's layer (false: it had none), and says
	// which change that is.
	DropPolicy(ctx context.Context, tenant string) (bool, uint64, error)
	// AllPolicies is every layer kept, by tenant, and the change it is
	// as of (PolicyChanges' since).
	AllPolicies(ctx context.Context) (map[string][]byte, uint64, error)
}

// PolicyChange is a tenant's layer as a change left it (nil: dropped), and
// which change that was.
type PolicyChange struct {
	Layer  []byte
	Change uint64
}

// PolicyChanges is what a store many processes share tells of the policies
// other processes set: the tenants changed after since, and the change
// they are as of. A store whose count of changes went back (a Redis that
// lost its data) answers one below since: read them all again.
type PolicyChanges interface {
	PolicyChanges(ctx context.Context, since uint64) (map[string]PolicyChange, uint64, error)
}

// Repacer places a tenant's waiting jobs anew by the policy in force now
// (rules.Repace), after its policy changed (set by the API): a faster one
// brings its backlog forward, a slower one moves it back. On Redis the
// partition's owner does it, in whichever process that is.
type Repacer interface {
	Repace(ctx context.Context, tenant string) error
}
