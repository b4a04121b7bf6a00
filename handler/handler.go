package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Job is one attempt's job as a handler gets it.
type Job struct {
	// ID is the job's id, the same on every attempt: a handler that must
	// not do a job twice uses it as the vendor's idempotency key.
	ID     string
	Tenant string
	// Downstream is the name of the downstream the job goes to (the
	// config's [downstreams.NAME]).
	Downstream string
	// Type is the job's "type" as enqueued ("": none).
	Type string
	// Attempt counts attempts, 1 for the first.
	Attempt int
	// Payload is the job's payload as enqueued (JSON).
	Payload json.RawMessage
	// Request is what the job asked of its downstream's request (nil:
	// nothing), as far as the downstream's job_paths, job_methods and
	// job_headers allow.
	Request *Request
	// Started is the instant throttler recorded as this attempt's start,
	// right before the call: the tenant's next attempt is spaced from it
	// (invariant 1). A busy machine may run the handler's first line
	// some milliseconds later: pacing is checked against Started.
	Started time.Time
}

// Request is what a job asked of its downstream's request: the handler
// decides what each part means.
type Request struct {
	Method  string
	Path    string
	Query   map[string][]string
	Headers map[string]string
}

// Handler handles a job: see the package doc for what its error decides.
// The bytes it returns are kept as the job's response.
type Handler interface {
	Handle(ctx context.Context, job *Job) ([]byte, error)
}

// Preparer is a Handler that can do its preparation before its slot. The
// dispatcher calls Prepare before the attempt waits at the gate and the
// function it returns at the slot, so that little lies between the instant
// the gate records as the send and the handler's own first line (a busy
// machine can stretch any work there past DESIGN.md's 2 ms of jitter).
// Handle must do the same as Prepare and then its function.
type Preparer interface {
	Handler
	Prepare(ctx context.Context, job *Job) func() ([]byte, error)
}

// Typed is a Handler that knows the job types it handles (an asynq
// ServeMux knows its patterns: package asynqhandler). In a process that
// has it, a job of a type it does not handle is refused at admission (422
// unknown_type, nothing queued), and one that reaches it anyway (enqueued
// through a process without the handler, such as a stock API process on
// Redis) fails at once instead of being retried: no attempt can change
// its type.
type Typed interface {
	Handler
	// Handles reports whether a job of downstream with type typ ("" for
	// a job without one) has a handler.
	Handles(downstream, typ string) bool
}

// HandlerFunc is a function as a Handler.
type HandlerFunc func(ctx context.Context, job *Job) ([]byte, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, job *Job) ([]byte, error) { return f(ctx, job) }

// Middleware wraps a handler (logging, tracing, metrics), as asynq's
// MiddlewareFunc does.
type Middleware func(Handler) Handler

// Mux holds handlers by the name downstreams give (handler = "NAME"),
// with middleware around each. Register before Run; safe for concurrent
// use.
type Mux struct {
	mu         sync.RWMutex
	handlers   map[string]Handler
	middleware []Middleware
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{handlers: map[string]Handler{}} }

// Handle registers h under name. A name registered twice panics, as
// net/http's ServeMux does: it is a programming error.
func (m *Mux) Handle(name string, h Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h == nil {
		panic("handler: nil handler for " + name)
	}
	if _, dup := m.handlers[name]; dup {
		panic(fmt.Sprintf("handler: %q registered twice", name))
	}
	m.handlers[name] = h
}

// HandleFunc registers f under name.
func (m *Mux) HandleFunc(name string, f func(ctx context.Context, job *Job) ([]byte, error)) {
	m.Handle(name, HandlerFunc(f))
}

// Use adds middleware around every handler, the first added outermost.
func (m *Mux) Use(mw ...Middleware) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.middleware = append(m.middleware, mw...)
}

// Names lists the registered names, sorted.
func (m *Mux) Names() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Sorted(maps.Keys(m.handlers))
}

// typed is name's handler as a Typed, unwrapped (the middleware does not
// say which types it handles); nil when it is not one.
func (m *Mux) typed(name string) Typed {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, _ := m.handlers[name].(Typed)
	return t
}

// handler is name's handler wrapped in the middleware (nil: none).
func (m *Mux) handler(name string) Handler {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h := m.handlers[name]
	if h == nil {
		return nil
	}
	for i := len(m.middleware) - 1; i >= 0; i-- {
		h = m.middleware[i](h)
	}
	return h
}

type jobKey struct{}

// JobFromContext is the job a handler's context was made for: what a
// handler that only gets the context (an asynq handler) reads its id,
// tenant and attempt from.
func JobFromContext(ctx context.Context) (*Job, bool) {
	j, ok := ctx.Value(jobKey{}).(*Job)
	return j, ok
}

// JSON is a Handler that decodes each job's payload into a T first (as
// river's Worker[T]): a payload that does not decode fails the job
// permanently, since no retry can change it.
func JSON[T any](f func(ctx context.Context, job *Job, payload T) ([]byte, error)) Handler {
	return HandlerFunc(func(ctx context.Context, job *Job) ([]byte, error) {
		var v T
		if err := json.Unmarshal(job.Payload, &v); err != nil {
			return nil, Permanent(fmt.Errorf("the payload is not a %T: %w", v, err))
		}
		return f(ctx, job, v)
	})
}
