// Package redis is the queue.Store of many throttler processes sharing one
// Redis (standalone, Sentinel or Cluster). It owns everything of that
// backend: the Redis keys (keys.go), the Lua scripts beside the Go that
// runs them (admission and keeping a batch: enqueue.go; the claim of a due
// job: claim.go; outcomes: outcome.go; pauses and holds: hold.go; the
// shared gate: gate.go), the asynq tasks that carry the jobs (task.go,
// consume.go), and the background parts a worker runs beside its asynq
// servers, one component and one file each: the lease renewer
// (renewer.go), the recoverer of crashed workers' jobs (recoverer.go) and
// the sweeper of the hand-off set (sweeper.go). The rules both backends
// share (admission's pre-check, outcomes, tenant records) are package
// queue's.
//
// Bucket state and jobs are Redis hashes changed by Lua scripts (one round
// trip per decision, atomic across processes, in the server's clock); each
// waiting job is an asynq task due a little before its slot. A worker
// claims the job when its task runs, waits for the exact slot, and passes
// the gate in Redis (PassGate) right before the request is written: the
// schedule predicts, the gate enforces.
package redis

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/clock"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

var (
	_ queue.Store      = (*Store)(nil)
	_ queue.SharedGate = (*Store)(nil)
)

// Store is the Redis backend of queue.Store. All methods are safe for
// concurrent use, by any number of processes on one Redis.
type Store struct {
	rdb      goredis.UniversalClient
	tasks    *asynq.Client
	policy   queue.PolicyFunc
	ceiling  queue.CeilingFunc
	clock    clock.Clock // nil: the Redis server's TIME
	log      *slog.Logger
	retain   time.Duration
	idle     time.Duration
	lag      time.Duration
	timing   Timing
	expired  func(queue.Job)
	ownsConn bool

	resumesMu sync.Mutex
	resumes   map[string]chan struct{} // tenant -> closed when resumed here

	// trouble is when this process last failed to reach Redis (unix ns):
	// for a lease after it, it takes back no other worker's job (theirs
	// may have lapsed only because Redis was away).
	trouble atomic.Int64
}

// Timing is how the store drives asynq. Zero fields take the defaults.
type Timing struct {
	// Poll is asynq's TaskCheckInterval: how often an idle worker looks for
	// a due task (it sleeps 0.5x to 1.5x this). Default 20 ms: a job that
	// can go at once waits about that long for a worker.
	Poll time.Duration
	// Forward is asynq's DelayedTaskCheckInterval: how often scheduled
	// tasks that came due move to the pending list. Default 100 ms.
	Forward time.Duration
	// Lease is how long a worker that stopped renewing (it crashed) keeps
	// the job it was sending before another worker takes it back.
	// Default 10 s.
	Lease time.Duration
}

func (t Timing) withDefaults() Timing {
	t.Poll = cmp.Or(t.Poll, 20*time.Millisecond)
	t.Forward = cmp.Or(t.Forward, 100*time.Millisecond)
	t.Lease = cmp.Or(t.Lease, 10*time.Second)
	return t
}

// early is how long before its slot a job's task is made due: asynq
// stores due times in whole seconds (a task can start up to 1 s early,
// never late on that account) and moves due tasks every Forward.
func (t Timing) early() time.Duration { return time.Second + 2*t.Forward }

// Options configure Open.
type Options struct {
	// Client is the connection, shared with asynq. Required.
	Client goredis.UniversalClient
	// OwnsClient: Close closes Client too.
	OwnsClient bool
	// Policy gives each tenant's bucket. Required.
	Policy queue.PolicyFunc
	// Ceiling names a tenant's downstream and its ceiling (nil: none).
	Ceiling queue.CeilingFunc
	// Clock, if set, decides instead of the Redis server's TIME (tests).
	// Every process must then share it; production leaves it nil.
	Clock clock.Clock
	// Retention keeps finished jobs this long. Default 24 h.
	Retention time.Duration
	// IdleTTL: a tenant's bucket state expires this long after its
	// schedule runs out (a tenant seen again then starts afresh).
	// Default 10 min.
	IdleTTL time.Duration
	// StartLag is how long a send takes to start: the time from a job's
	// slot to a worker having claimed it. Default Timing.Poll + 20 ms;
	// negative: none.
	StartLag time.Duration
	Timing   Timing
	// OnExpired is told of each job that expired unsent (nil: nobody).
	OnExpired func(queue.Job)
	Logger    *slog.Logger
}

// Open returns a store on opts.Client. It checks that Redis answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Client == nil {
		return nil, errors.New("redis: Open needs Options.Client")
	}
	if opts.Policy == nil {
		return nil, errors.New("redis: Open needs Options.Policy")
	}
	timing := opts.Timing.withDefaults()
	s := &Store{
		rdb:      opts.Client,
		tasks:    asynq.NewClientFromRedisClient(opts.Client),
		policy:   opts.Policy,
		ceiling:  opts.Ceiling,
		clock:    opts.Clock,
		log:      cmp.Or(opts.Logger, slog.Default()),
		retain:   cmp.Or(opts.Retention, 24*time.Hour),
		idle:     cmp.Or(opts.IdleTTL, 10*time.Minute),
		lag:      max(cmp.Or(opts.StartLag, timing.Poll+20*time.Millisecond), 0),
		timing:   timing,
		expired:  opts.OnExpired,
		ownsConn: opts.OwnsClient,
		resumes:  map[string]chan struct{}{},
	}
	if s.ceiling == nil {
		s.ceiling = func(string) (string, *leaky.Policy) { return "", nil }
	}
	if s.expired == nil {
		s.expired = func(queue.Job) {}
	}
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Ping implements queue.Store.
func (s *Store) Ping(ctx context.Context) error {
	return queue.Unavailable(s.rdb.Ping(ctx).Err())
}

// Close implements queue.Store.
func (s *Store) Close() error {
	if s.ownsConn {
		return s.rdb.Close()
	}
	return nil
}

// now is the time scripts are told: 0 asks them for the server's TIME.
func (s *Store) now() int64 {
	if s.clock == nil {
		return 0
	}
	return micros(s.clock.Now())
}

// serverNow is the current time of the decisions' clock.
func (s *Store) serverNow(ctx context.Context) (time.Time, error) {
	if s.clock != nil {
		return s.clock.Now(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, queue.Unavailable(err)
	}
	return t, nil
}

// localNow is this process's time on the store's clock (new job ids).
func (s *Store) localNow() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}

// markTrouble records that Redis could not be reached just now.
func (s *Store) markTrouble() { s.trouble.Store(time.Now().UnixNano()) }
