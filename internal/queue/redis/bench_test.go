package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/redistest"
)

// roundTrips counts the client's round trips to Redis (a pipeline or a
// transaction is one).
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) hook() goredis.Hook {
	return hook{
		cmd:      func(goredis.Cmder) error { r.n.Add(1); return nil },
		pipeline: func([]goredis.Cmder) { r.n.Add(1) },
	}
}

// commands is the server's count of commands run so far (INFO
// commandstats), scripts' own calls included.
func commands(b *testing.B, rdb *goredis.Client) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		if _, rest, ok := strings.Cut(line, ":calls="); ok {
			v, _, _ := strings.Cut(rest, ",")
			c, _ := strconv.ParseInt(v, 10, 64)
			n += c
		}
	}
	return n
}

// BenchmarkRedisAgainstPlainAsynq runs the same number of jobs end to end
// (enqueued from 64 goroutines over 1000 tenants, each handled once)
// through the Redis store, and through plain asynq with a no-op handler
// and no limiter, back to back on one redis-server (AOF, appendfsync
// everysec, as docs/redis.md advises), and reports both throughputs, their
// ratio, round trips per admission and Redis commands per job (INFO
// commandstats, scripts' own calls included; -v logs them by command).
// Tenants are fast (1000/s) so that the limiter's pacing is not what is
// measured. The store's path for each job: admission (enqueue.lua: the
// decision, the job's hash, a line on its partition's arrivals list); the
// partition's owner learns of it from the arrivals list (one pipelined
// LPOP for all its partitions); a batch claim (claim.lua, fenced); the
// in-process gate (no round trip: no downstream ceiling); a batch
// outcome (finish.lua, fenced). The worker warms up first (a new Redis
// holds every partition vacant for one lease): that wait is not timed.
//
//	go test -run '^$' -bench RedisAgainstPlainAsynq -benchtime 1x -count 3 ./internal/queue/redis
func BenchmarkRedisAgainstPlainAsynq(b *testing.B) {
	srv := redistest.Start(b, true)
	for range b.N {
		plain, plainCmds := runPlainAsynq(b, srv.Addr)
		ours, ourCmds, admitTrips := runThroughStore(b, srv.Addr)
		b.ReportMetric(float64(benchJobs)/plain.Seconds(), "asynq-jobs/s")
		b.ReportMetric(float64(benchJobs)/ours.Seconds(), "throttler-jobs/s")
		b.ReportMetric(plain.Seconds()/ours.Seconds(), "ratio")
		b.ReportMetric(float64(admitTrips)/benchJobs, "round-trips/admission")
		b.ReportMetric(float64(plainCmds)/benchJobs, "asynq-cmds/job")
		b.ReportMetric(float64(ourCmds)/benchJobs, "throttler-cmds/job")
	}
}

// The benchmark's load: jobs from producers over tenants, handled by
// workers.
const benchJobs, benchProducers, benchTenants, benchWorkers = 20_000, 64, 1000, 256

// benchQueues is how many asynq queues plain asynq spreads the jobs over
// (a server per queue, as throttler's builds on asynq had).
const benchQueues = 8

// runPlainAsynq runs the jobs through plain asynq (a no-op handler, no
// limiter): how long it took, and the Redis commands it ran.
func runPlainAsynq(b *testing.B, addr string) (time.Duration, int64) {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 300})
	defer rdb.Close()
	rdb.FlushAll(context.Background())
	before := commands(b, rdb)
	var handled atomic.Int64
	done := make(chan struct{})
	qs := map[string]int{}
	for p := range benchQueues {
		qs[owner.Tag(p)] = 1
	}
	server := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: benchWorkers, Queues: qs,
		TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	server.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if handled.Add(1) == benchJobs {
			close(done)
		}
		return nil
	}))
	client := asynq.NewClientFromRedisClient(rdb)
	began := time.Now()
	produce(b, benchProducers, benchJobs, func(i int) error {
		_, err := client.Enqueue(asynq.NewTask("x", []byte(fmt.Sprintf(`{"n":%d}`, i))),
			asynq.Queue(owner.Tag(owner.PartitionOf(fmt.Sprint("t", i%benchTenants), benchQueues))))
		return err
	})
	<-done
	took := time.Since(began)
	server.Shutdown()
	return took, commands(b, rdb) - before
}

// runThroughStore runs the same jobs through the store, as an API process
// and a worker process would (the admissions' round trips are counted on
// the API's own connection): how long it took, the Redis commands it ran,
// and the round trips of the admissions.
func runThroughStore(b *testing.B, addr string) (took time.Duration, cmds, admitTrips int64) {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 300})
	defer rdb.Close()
	rdb.FlushAll(context.Background())
	apiConn := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 100})
	defer apiConn.Close()
	rt := &roundTrips{}
	apiConn.AddHook(rt.hook())
	fast := func(string) leaky.Policy { return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 1000} }
	s, err := Open(context.Background(), Options{Client: rdb, StartLag: -1, Policy: fast})
	if err != nil {
		b.Fatal(err)
	}
	api, err := Open(context.Background(), Options{Client: apiConn, StartLag: -1, Policy: fast})
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		s.Consume(ctx, func(ctx context.Context, j queue.Job) queue.Outcome {
			if handled.Add(1) == benchJobs {
				close(done)
			}
			return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: time.Now()}
		}, queue.ConsumeOptions{Concurrency: benchWorkers})
	}()
	// Warm up: a brand-new Redis holds every partition vacant for one
	// lease before the worker may take it. That wait is not the path
	// measured, and neither are the leases' own commands until then.
	waitReady(b, s)
	rdb.ConfigResetStat(context.Background()) // -v logs this run's commands alone
	before := commands(b, rdb)
	began := time.Now()
	trips := rt.n.Load()
	produce(b, benchProducers, benchJobs, func(i int) error {
		out, err := api.Enqueue(context.Background(), fmt.Sprint("t", i%benchTenants), []queue.NewJob{queuetest.Payload(i)})
		if err == nil && !out[0].Admitted() {
			err = fmt.Errorf("refused: %+v", out[0])
		}
		return err
	})
	admitTrips = rt.n.Load() - trips
	<-done
	took = time.Since(began)
	stop()
	<-consumed
	if testing.Verbose() {
		info, _ := rdb.Info(context.Background(), "commandstats").Result()
		b.Log(info)
	}
	return took, commands(b, rdb) - before, admitTrips
}

// waitReady waits until every partition has an owner and this worker's
// partitions are loaded.
func waitReady(b *testing.B, s *Store) {
	deadline := time.Now().Add(time.Minute)
	for !s.Ready(context.Background()) {
		if time.Now().After(deadline) {
			b.Fatal("the worker never held every partition")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// produce calls enqueue for jobs 0..n-1 from several goroutines.
func produce(b *testing.B, producers, n int, enqueue func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := enqueue(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkRedisEnqueueScheduled is the Redis store's admissions with and
// without a not_before on every job, in the same run, as the embedded
// store's BenchmarkEnqueueScheduled: 64 goroutines, single jobs over 1000
// tenants, each booked 1 to 25 hours ahead in "not_before" (a tenant's
// bookings are one field of its hash that every admission of it reads).
// No worker runs: admission alone is measured.
//
//	go test -run '^$' -bench 'RedisEnqueueScheduled' -benchtime 5s ./internal/queue/redis
func BenchmarkRedisEnqueueScheduled(b *testing.B) {
	policy := func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 1_000_000, MaxScheduled: 1_000_000}
	}
	for _, scheduled := range []bool{false, true} {
		b.Run(map[bool]string{false: "prompt", true: "not_before"}[scheduled], func(b *testing.B) {
			rdb := redisClient(b, 128)
			seenPartitions(b, rdb)
			s, err := Open(context.Background(), Options{Client: rdb, Policy: policy})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var n atomic.Int64
			payload := []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)
			start := time.Now()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					nj := queue.NewJob{Payload: payload}
					if scheduled {
						nj.NotBefore = start.Add(time.Hour + time.Duration(i*7919%86400)*time.Second)
					}
					out, err := s.Enqueue(context.Background(), fmt.Sprintf("t%d", i%1000), []queue.NewJob{nj})
					if err != nil || !out[0].Admitted() || (scheduled && out[0].Job.State != queue.StateScheduled) {
						b.Errorf("enqueue: %v %+v", err, out)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "admissions/s")
		})
	}
}
