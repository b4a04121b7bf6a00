package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"throttler/internal/queue"
)

// taskType is the asynq type of every throttler job task.
const taskType = "throttler:job"

// maxTaskRetry bounds asynq's own retries, which count only crashes (a
// worker's lease running out): throttler reschedules its tasks without
// using retries, and counts failed attempts itself (max_attempts).
const maxTaskRetry = 1000

// jobIDLen is the length of a job id (queue.NewID's), the head of a task's
// payload.
const jobIDLen = 26

// makeTask makes the asynq task that carries job j's next attempt, due a
// little before its dispatch time. If that fails, the job stays in the
// hand-off set and the sweeper makes the task later.
func (s *Store) makeTask(ctx context.Context, j queue.Job) {
	if err := s.enqueueTask(ctx, j.ID, j.Tenant, j.ID, j.DispatchAt); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		s.log.Warn("job admitted, its asynq task not made yet: the sweeper will make it", "job", j.ID, "err", err)
	}
}

// enqueueTask makes task taskID of job jobID, due early() before
// dispatchAt (zero: due at once; its claim says how long to wait).
func (s *Store) enqueueTask(ctx context.Context, jobID, tenant, taskID string, dispatchAt time.Time) error {
	shard, _ := shardOfID(jobID)
	opts := []asynq.Option{asynq.TaskID(taskID), asynq.Queue(queueName(shard)), asynq.MaxRetry(maxTaskRetry)}
	if s.clock == nil { // with a test clock, due at once: the worker waits on that clock
		if at := dispatchAt.Add(-s.timing.early()); at.After(time.Now()) {
			opts = append(opts, asynq.ProcessAt(at))
		}
	}
	_, err := s.tasks.EnqueueContext(ctx, asynq.NewTask(taskType, []byte(jobID+tenant)), opts...)
	return err
}

// splitTaskPayload reads a task's payload: its job's id, then its tenant.
func splitTaskPayload(b []byte) (jobID, tenant string) {
	if len(b) < jobIDLen {
		return string(b), ""
	}
	return string(b[:jobIDLen]), string(b[jobIDLen:])
}

// asynqLogger sends asynq's log lines to the store's logger.
type asynqLogger struct{ s *Store }

func (l asynqLogger) Debug(args ...any) { l.s.log.Debug(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Info(args ...any)  { l.s.log.Info(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Warn(args ...any)  { l.s.log.Warn(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Error(args ...any) { l.s.log.Error(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Fatal(args ...any) { l.s.log.Error(fmt.Sprint(args...), "from", "asynq") }
