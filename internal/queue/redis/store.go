// Package redis is the queue.Store of many throttler processes sharing one
// Redis (standalone, Sentinel or Cluster), built on partitioned ownership
// (DESIGN.md section 4). It owns everything of that backend: the Redis keys
// (keys.go), the Lua scripts beside the Go that runs them (admission:
// enqueue.go; claims: claim.go; outcomes: outcome.go; a new owner's
// takeover: takeover.go; pauses and holds: hold.go; the shared gate of a
// downstream ceiling: gate.go), and the consumer of a worker (consume.go,
// owned.go). Which worker owns which partition is package owner's; the
// rules both backends share are package queue's.
//
// Tenants hash onto P partitions. Admission is one script on any process:
// the GCRA decision in the server's clock, the durable job, and a line in
// the partition's arrivals list. Each partition is owned by one worker at
// a time (a lease with an epoch): the owner learns of its partition's jobs
// from the arrivals in batches, keeps their schedule in memory, claims
// each a lead before its slot in batches, hands it to the dispatcher
// (which paces it from the real write, in process, as on the embedded
// store), and records outcomes in batches. Every write of the owner is
// fenced by its epoch: once another worker has taken the partition, the
// old owner's writes are refused.
package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
)

var (
	_ queue.Store          = (*Store)(nil)
	_ queue.SharedGate     = (*Store)(nil)
	_ queue.PolicyListener = (*Store)(nil)
	_ queue.Ownership      = (*Store)(nil)
)

// Store is the Redis backend of queue.Store. All methods are safe for
// concurrent use, by any number of processes on one Redis.
type Store struct {
	rdb        goredis.UniversalClient
	partitions int
	policy     queue.PolicyFunc
	ceiling    queue.CeilingFunc
	caps       queue.CapsFunc
	clock      clock.Clock // nil: the Redis server's TIME
	rclock     *redisClock // this process's reading of Redis's clock (of Clock, with TestHooks.OwnClock); nil on an injected Clock alone
	log        *slog.Logger
	retain     time.Duration
	idle       time.Duration
	lag        time.Duration
	admitting  *semaphore.Weighted // jobs of admission scripts in Redis now (admittingAtOnce)
	timing     Timing
	workerID   string
	expired    func(queue.Job)
	ownsConn   bool

	notices finishedNotices // jobs' final states, told between processes (?wait)

	consumersMu sync.Mutex
	consumers   map[*consumer]struct{} // this process's Consume calls
	handed      atomic.Int64           // handler calls begun (Handed)
}

// Timing is how a worker learns of jobs and holds its partitions. Zero
// fields take the defaults.
type Timing struct {
	// Poll is how often an owner with nothing new looks at its partitions'
	// arrivals (one pipelined round trip for all of them). Default 20 ms:
	// a job that can go at once waits about that long to be seen, and
	// admission counts it in its start lag.
	Poll time.Duration
	// Lease is a partition's lease: a worker that dies holding partitions
	// has them taken over about this long after its last renewal (a
	// worker that stops cleanly hands them over at once). Default
	// owner.LeaseDefault (5 s). Every worker on one Redis should give the
	// same.
	Lease time.Duration
	// Balance is how often a worker looks at its share of the partitions
	// (and sends its heartbeat). Default Lease/5.
	Balance time.Duration
}

func (t Timing) withDefaults() Timing {
	t.Poll = cmp.Or(t.Poll, 20*time.Millisecond)
	t.Lease = cmp.Or(t.Lease, owner.LeaseDefault)
	return t
}

// Options configure Open.
type Options struct {
	// Client is the connection. Required.
	Client goredis.UniversalClient
	// OwnsClient: Close closes Client too.
	OwnsClient bool
	// Partitions is P, how many partitions the tenants hash onto: fixed
	// per Redis (the first process records it; one configured otherwise is
	// refused). At most MaxPartitions. Default owner.PartitionsDefault.
	Partitions int
	// WorkerID names this process among the partitions' owners (unique
	// among live workers). Default hostname-pid-random.
	WorkerID string
	// Policy gives each tenant's bucket. Required.
	Policy queue.PolicyFunc
	// Ceiling names a tenant's downstream and its ceiling (nil: none).
	Ceiling queue.CeilingFunc
	// Caps gives a tenant's caps on attempts in flight (default: none).
	Caps queue.CapsFunc
	// Clock, if set, decides instead of the Redis server's TIME (tests).
	// Every process must then share it; production leaves it nil.
	Clock clock.Clock
	// Testing is for tests only; production leaves it nil (no config
	// setting, flag or environment variable reaches it).
	Testing *TestHooks
	// Retention keeps finished jobs this long. Default 24 h.
	Retention time.Duration
	// IdleTTL: a tenant's bucket state expires this long after its
	// schedule runs out (a tenant seen again then starts afresh).
	// Default 10 min.
	IdleTTL time.Duration
	// StartLag is how long a send takes to start: the time from a job's
	// admission to its request being written, for a job that can go at
	// once (its owner learns of it within a Poll, claims it, hands it
	// over). Default Timing.Poll + 60 ms: with 20 ms for the rest, on a
	// busy two-core machine the first job of each tenant came 30-80 ms
	// late, and each tenant's whole queue with it (sends are paced from
	// the real write); with 60 ms, 0.4-0.9 ms at p50. Negative: none.
	StartLag time.Duration
	Timing   Timing
	// OnExpired is told of each job that expired unsent (nil: nobody).
	OnExpired func(queue.Job)
	Logger    *slog.Logger
}

// TestHooks change how a store reads time, for tests: a test cannot move
// the machine's clock. The store measures its offset to Redis TIME from
// round trips and works in Redis's clock, so a skew must change nothing.
type TestHooks struct {
	// ClockSkew: this process's own clock reads the machine's plus
	// ClockSkew, as a machine whose clock is off would. Ignored with
	// Options.Clock set.
	ClockSkew time.Duration
	// OwnClock, with Options.Clock: this process's own clock, which may
	// read other than Clock (a skew). Clock then stands for Redis's TIME:
	// the store measures its offset to Clock as it does to Redis TIME, and
	// reads Clock's time as own clock plus offset, as a worker on a
	// machine whose clock is off does (the model test's workers, whose
	// times must come out as with no skew).
	OwnClock clock.Clock
}

// Open returns a store on opts.Client. It checks that Redis answers and
// records P there (or finds it recorded: a *owner.PartitionsError if it
// differs).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Client == nil {
		return nil, errors.New("redis: Open needs Options.Client")
	}
	if opts.Policy == nil {
		return nil, errors.New("redis: Open needs Options.Policy")
	}
	partitions := cmp.Or(opts.Partitions, owner.PartitionsDefault)
	if partitions < 1 || partitions > MaxPartitions {
		return nil, fmt.Errorf("redis: %d partitions: want 1 to %d", partitions, MaxPartitions)
	}
	timing := opts.Timing.withDefaults()
	s := &Store{
		rdb:        opts.Client,
		partitions: partitions,
		policy:     opts.Policy,
		ceiling:    opts.Ceiling,
		caps:       opts.Caps,
		clock:      opts.Clock,
		log:        cmp.Or(opts.Logger, slog.Default()),
		retain:     cmp.Or(opts.Retention, 24*time.Hour),
		idle:       cmp.Or(opts.IdleTTL, 10*time.Minute),
		lag:        max(cmp.Or(opts.StartLag, timing.Poll+60*time.Millisecond), 0),
		admitting:  semaphore.NewWeighted(admittingAtOnce),
		timing:     timing,
		workerID:   opts.WorkerID,
		expired:    opts.OnExpired,
		ownsConn:   opts.OwnsClient,
		consumers:  map[*consumer]struct{}{},
	}
	if s.ceiling == nil {
		s.ceiling = func(string) (string, *leaky.Policy) { return "", nil }
	}
	if s.caps == nil {
		s.caps = func(string) queue.Caps { return queue.Caps{} }
	}
	if s.expired == nil {
		s.expired = func(queue.Job) {}
	}
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	hooks := cmp.Or(opts.Testing, &TestHooks{})
	switch {
	case s.clock == nil:
		s.rclock = &redisClock{own: clock.Real{}}
		if hooks.ClockSkew != 0 {
			s.rclock.own = skewed(hooks.ClockSkew)
		}
	case hooks.OwnClock != nil:
		server := s.clock
		s.rclock = &redisClock{own: hooks.OwnClock, server: func(context.Context) (time.Time, error) { return server.Now(), nil }}
	}
	if s.rclock != nil {
		if s.rclock.server == nil {
			s.rclock.rdb = s.rdb
		}
		if err := s.rclock.calibrate(ctx, s.rdb); err != nil {
			return nil, queue.Unavailable(err)
		}
	}
	if err := refuseShardedData(ctx, s.rdb); err != nil {
		return nil, err
	}
	if err := owner.RecordPartitions(ctx, s.rdb, partitions); err != nil {
		return nil, err
	}
	return s, nil
}

// refuseShardedData refuses a Redis that still holds jobs of the builds
// before partitions (eight asynq shards, keys throttler:{throttler-N}:...):
// this build would not see them, and they would wait for ever.
func refuseShardedData(ctx context.Context, rdb goredis.UniversalClient) error {
	for shard := range 8 {
		n, err := rdb.ZCard(ctx, fmt.Sprintf("throttler:{throttler-%d}:active", shard)).Result()
		if err != nil {
			return queue.Unavailable(err)
		}
		if n > 0 {
			return fmt.Errorf("redis: this Redis holds jobs of an older throttler (tenants with jobs under throttler:{throttler-%d}:active), which this build does not read: let the older build deliver them first (stop admitting, wait for GET /v1/tenants to show none), then start this one", shard)
		}
	}
	return nil
}

// Ping implements queue.Store.
func (s *Store) Ping(ctx context.Context) error {
	return queue.Unavailable(s.rdb.Ping(ctx).Err())
}

// Close implements queue.Store.
func (s *Store) Close() error {
	s.closeNotices()
	if s.rclock != nil {
		s.rclock.close() // a measurement fresh started ends within a second
	}
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

// scriptNow is the time the scripts on every job's path (its admission,
// its claim, its outcome) are told: this process's reading of Redis's
// clock when it is known within scriptClockBound (redisClock.fresh), which
// spares each of them a TIME; else 0, and the script asks Redis.
func (s *Store) scriptNow() int64 {
	if s.clock != nil {
		return micros(s.clock.Now())
	}
	if t, ok := s.rclock.fresh(scriptClockBound); ok {
		return micros(t)
	}
	return 0
}

// scriptClockBound is how far the reading told to a script may be from
// Redis's TIME: a promise is made from it and a slot counted from it, so
// no more than the jitter the rules allow a send.
const scriptClockBound = time.Millisecond

// clockMargin is how early this process's reading of Redis's clock may
// be (redisClock.Uncertainty; 0 on an injected clock). A floor one worker
// hands another (the earliest a tenant's next send may go) is raised by the
// margin of the worker that stamped it and again by the margin of the one
// that waits for it, so that two estimates of the offset, each a few ms
// off on a busy machine, cannot bring two sends closer than the rate.
func (s *Store) clockMargin() time.Duration {
	if s.rclock == nil {
		return 0
	}
	return s.rclock.Uncertainty()
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

// localNow is the store's clock as this process reads it: Redis's, from
// the offset measured (the schedule in memory holds Redis-clock times).
func (s *Store) localNow() time.Time { return s.Clock().Now() }

// Clock implements queue.Store, the clock the store's times are in: Redis's
// TIME as this process reads it (its own clock plus the offset measured),
// or Options.Clock. The dispatcher waits for dispatch times and stamps
// writes on it, so a job's dispatch time and a send's time, which other
// workers read, are in Redis's clock.
func (s *Store) Clock() clock.Clock {
	if s.rclock != nil {
		return s.rclock
	}
	return s.clock
}
