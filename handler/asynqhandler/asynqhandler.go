// Package asynqhandler runs handlers written for asynq (an asynq.Handler,
// so an *asynq.ServeMux with its middleware too) as throttler handlers,
// unchanged: throttler gives them what asynq cannot, a bounded queue per
// tenant, paced across processes, with an expected delay at enqueue.
//
// Each attempt calls the asynq handler with an *asynq.Task built from the
// job: its type is the job's "type" (enqueue with {"payload": ...,
// "type": "email:welcome"}), or the downstream's name when the job has
// none; its payload is the job's payload, as enqueued (JSON bytes).
// The handler's error decides as asynq's would:
//
//   - nil: the job succeeded;
//   - asynq.SkipRetry (errors.Is): the job fails, not retried (asynq
//     archives it);
//   - asynq.RevokeTask: the job ends cancelled (asynq drops it);
//   - a handler.Pushback error: the tenant pauses (asynq has none);
//   - any other error: retried with backoff, up to the downstream's
//     max_attempts.
//
// A task type an *asynq.ServeMux has no handler for is not retried as
// asynq would retry its "handler not found": the adapter is a
// handler.Typed, so the service refuses such a job at admission (422
// unknown_type) where the process has the handler, and one that reaches
// it anyway fails at once.
//
// What does not carry over from asynq's server: asynq.GetTaskID,
// GetRetryCount, GetMaxRetry and GetQueueName report ok = false (they
// read values only asynq's server can put in the context; use
// handler.JobFromContext for the job's id, tenant and attempt instead);
// task.ResultWriter() is nil (return the result instead: the handler
// package keeps a handler's returned bytes, and this adapter returns
// none, so a job's response is empty). asynq's task options are the
// job's own fields and throttler's config instead: the job's not_before
// (ProcessAt, ProcessIn), deadline (Deadline) and idempotency key
// (TaskID); the downstream's max_attempts (MaxRetry) and timeout
// (Timeout); the tenant's own queue and rate (Queue).
//
// A producer written for asynq enqueues through throttler's client with
// Job, which turns a task and its options into a client.Job: the task's
// type and payload bytes reach the handler as they were, ProcessAt and
// ProcessIn schedule the job (booked at the first slot at or after that
// time that the tenant's limits allow), and an option with no throttler
// meaning is refused, naming the setting that does its work.
package asynqhandler

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/handler"
)

// New returns h as a throttler handler.
func New(h asynq.Handler) handler.Handler { return adapter{h} }

// adapter builds the task, and an *asynq.ServeMux routes it through its
// middleware, before the slot (handler.Preparer): at the slot only the
// handler's own chain runs.
type adapter struct{ h asynq.Handler }

func (a adapter) Handle(ctx context.Context, job *handler.Job) ([]byte, error) {
	return a.Prepare(ctx, job)()
}

func (a adapter) Prepare(ctx context.Context, job *handler.Job) func() ([]byte, error) {
	typ := taskType(job.Downstream, job.Type)
	task := asynq.NewTask(typ, job.Payload)
	h := a.h
	if mux, ok := h.(*asynq.ServeMux); ok {
		var pattern string
		h, pattern = mux.Handler(task) // what mux.ProcessTask does first
		if pattern == "" {
			// asynq's "handler not found" would be retried to the last
			// attempt, and no attempt can change the task's type.
			return func() ([]byte, error) {
				err := h.ProcessTask(ctx, task) // its middleware sees the call, as under asynq
				return nil, handler.Permanent(fmt.Errorf("the asynq ServeMux has no handler for task type %q (register one, or enqueue a type it has): %w", typ, err))
			}
		}
	}
	return func() ([]byte, error) { return nil, decide(h.ProcessTask(ctx, task)) }
}

// Handles implements handler.Typed: an *asynq.ServeMux handles the task
// types its patterns match (asked as its ProcessTask asks); any other
// asynq.Handler takes every type.
func (a adapter) Handles(downstream, typ string) bool {
	mux, ok := a.h.(*asynq.ServeMux)
	if !ok {
		return true
	}
	_, pattern := mux.Handler(asynq.NewTask(taskType(downstream, typ), nil))
	return pattern != ""
}

// taskType is the asynq task type of a job: its "type", or its
// downstream's name when it has none.
func taskType(downstream, typ string) string {
	if typ == "" {
		return downstream
	}
	return typ
}

// decide maps asynq's sentinel errors onto throttler's outcomes.
func decide(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, asynq.RevokeTask):
		return handler.Cancel(err)
	case errors.Is(err, asynq.SkipRetry):
		return handler.Permanent(err)
	}
	return err
}
