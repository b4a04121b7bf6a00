package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"throttler/internal/queue"
)

// consumer is one Consume call's state, shared by its asynq handlers.
type consumer struct {
	s    *Store
	h    queue.Handler
	lead time.Duration
	// held are the jobs this process holds, waiting for their slot or
	// being sent: the renewer renews their leases.
	held *heldJobs
	// sending bounds the jobs being sent (handed to h, not finished) by
	// Concurrency across the shards, as on the embedded store; tasks that
	// only wait for their slot are not bounded by it (each shard's server
	// holds that many).
	sending chan struct{}
}

// Consume implements queue.Store: an asynq server per shard, whose handler
// claims the task's job, hands it to h at its slot, and records the
// outcome. (One server per shard, not one for all: an asynq server takes
// tasks one at a time, a round trip each, and one would cap a worker's
// deliveries.) Beside them run the renewer (the leases of the jobs this
// process holds), the recoverer (the jobs of workers that died holding
// them) and the sweeper (the tasks of jobs whose admitting process died
// before it could make them).
func (s *Store) Consume(ctx context.Context, h queue.Handler, opts queue.ConsumeOptions) error {
	concurrency := cmp.Or(opts.Concurrency, 1024)
	c := &consumer{s: s, h: h, lead: cmp.Or(opts.Lead, queue.DefaultLead), held: newHeldJobs(), sending: make(chan struct{}, concurrency)}
	servers, err := s.startServers(ctx, c, concurrency)
	if err != nil {
		return err
	}
	// The renewer runs until the servers are down (not until ctx is done):
	// a send that outlives ctx is never taken back while it is written.
	renewer, recoverer, sweeper := newRenewer(s, c.held), newRecoverer(s), newSweeper(s)
	renewer.Start(context.WithoutCancel(ctx))
	recoverer.Start(ctx)
	sweeper.Start(ctx)
	<-ctx.Done()
	shutdown(servers)
	renewer.Stop()
	recoverer.Stop()
	sweeper.Stop()
	return nil
}

// startServers starts one asynq server per shard, all handing their tasks
// to c; none if one cannot start.
func (s *Store) startServers(ctx context.Context, c *consumer, concurrency int) ([]*asynq.Server, error) {
	mux := asynq.HandlerFunc(func(tctx context.Context, t *asynq.Task) error {
		taskID, _ := asynq.GetTaskID(tctx)
		jobID, tenant := splitTaskPayload(t.Payload())
		return c.runTask(ctx, jobID, tenant, taskID)
	})
	var servers []*asynq.Server
	for shard := range Shards {
		srv := asynq.NewServerFromRedisClient(s.rdb, asynq.Config{
			Concurrency:              concurrency,
			Queues:                   map[string]int{queueName(shard): 1},
			TaskCheckInterval:        s.timing.Poll,
			DelayedTaskCheckInterval: s.timing.Forward,
			IsFailure:                func(err error) bool { var nd *notDue; return !errors.As(err, &nd) },
			RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
				var nd *notDue
				if errors.As(err, &nd) {
					return nd.wait
				}
				return asynq.DefaultRetryDelayFunc(n, err, t)
			},
			// Handlers watch ctx themselves and give their jobs back at
			// once; this only bounds a send already being written.
			ShutdownTimeout: 30 * time.Second,
			Logger:          asynqLogger{s},
			LogLevel:        asynq.WarnLevel,
		})
		if err := srv.Start(mux); err != nil {
			shutdown(servers)
			return nil, fmt.Errorf("asynq server: %w", err)
		}
		servers = append(servers, srv)
	}
	return servers, nil
}

// shutdown shuts the servers down together: each waits for its handlers,
// which all see ctx and give their jobs back at once.
func shutdown(servers []*asynq.Server) {
	var down sync.WaitGroup
	for _, srv := range servers {
		down.Add(1)
		go func() { defer down.Done(); srv.Shutdown() }()
	}
	down.Wait()
}

// notDue is a handler's answer for a task whose job must wait longer than
// a worker should hold it: asynq runs the task again after wait, and,
// since it is not a failure (Config.IsFailure), uses up none of its
// retries.
type notDue struct{ wait time.Duration }

func (e *notDue) Error() string { return fmt.Sprintf("not due for %v", e.wait) }

// holdMax is how long a worker holds a claimed task waiting for its job's
// claim time, rather than handing it back to asynq: a task comes up to
// early() before its slot, so a worker holds it about that long.
func (s *Store) holdMax() time.Duration {
	if s.clock != nil {
		return time.Duration(1 << 62) // a test clock: asynq cannot wait on it
	}
	return s.timing.early() + time.Second
}
