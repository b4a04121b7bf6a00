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

	"throttler/internal/leaky"
	"throttler/internal/queue"
	"throttler/internal/redistest"
)

// roundTrips counts the client's round trips to Redis (a pipeline or a
// transaction is one).
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
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
// and no limiter, back to back on one redis-server, and reports both
// throughputs, their ratio, round trips per admission and Redis commands
// per job. Tenants are fast (1000/s) so that the limiter's pacing is not
// what is measured; every job still passes admission, claim, the shared
// gate and the outcome script.
//
//	go test -run '^$' -bench RedisAgainstPlainAsynq -benchtime 1x -count 3 ./internal/queue
func BenchmarkRedisAgainstPlainAsynq(b *testing.B) {
	const jobs, producers, tenants, workers = 20_000, 64, 1000, 256
	srv := redistest.Start(b, false)
	for range b.N {
		// plain asynq
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 300})
		rdb.FlushAll(context.Background())
		before := commands(b, rdb)
		var handled atomic.Int64
		done := make(chan struct{})
		qs := map[string]int{}
		for shard := range Shards {
			qs[queueName(shard)] = 1
		}
		server := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: workers, Queues: qs,
			TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.ErrorLevel})
		server.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			if handled.Add(1) == jobs {
				close(done)
			}
			return nil
		}))
		client := asynq.NewClientFromRedisClient(rdb)
		began := time.Now()
		produce(b, producers, jobs, func(i int) error {
			_, err := client.Enqueue(asynq.NewTask("x", []byte(fmt.Sprintf(`{"n":%d}`, i))),
				asynq.Queue(queueName(shardOf(fmt.Sprint("t", i%tenants)))))
			return err
		})
		<-done
		plain := time.Since(began)
		server.Shutdown()
		plainCmds := commands(b, rdb) - before
		rdb.Close()

		// the Redis store, same jobs
		// An API process and a worker process, as it were: the admissions'
		// round trips are counted on the API's own connection.
		rdb = goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 300})
		rdb.FlushAll(context.Background())
		apiConn := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: 100})
		rt := &roundTrips{}
		apiConn.AddHook(rt)
		fast := func(string) leaky.Policy { return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 1000} }
		s, err := Open(context.Background(), Options{Client: rdb, StartLag: -1, Policy: fast})
		if err != nil {
			b.Fatal(err)
		}
		api, err := Open(context.Background(), Options{Client: apiConn, StartLag: -1, Policy: fast})
		if err != nil {
			b.Fatal(err)
		}
		before = commands(b, rdb)
		handled.Store(0)
		done = make(chan struct{})
		ctx, stop := context.WithCancel(context.Background())
		consumed := make(chan struct{})
		go func() {
			defer close(consumed)
			s.Consume(ctx, func(ctx context.Context, j queue.Job) queue.Outcome {
				for {
					ans, err := s.PassGate(ctx, queue.GateRequest{Downstream: "d", Tenant: j.Tenant, Policy: leaky.Policy{Interval: time.Millisecond, Burst: 1}})
					if err != nil {
						return queue.Outcome{Result: queue.Released}
					}
					if ans.Wait == 0 {
						break
					}
					time.Sleep(ans.Wait)
				}
				if handled.Add(1) == jobs {
					close(done)
				}
				return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: time.Now()}
			}, queue.ConsumeOptions{Concurrency: workers})
		}()
		began = time.Now()
		trips := rt.n.Load()
		produce(b, producers, jobs, func(i int) error {
			out, err := api.Enqueue(context.Background(), fmt.Sprint("t", i%tenants), []queue.NewJob{payload(i)})
			if err == nil && !out[0].Admitted() {
				err = fmt.Errorf("refused: %+v", out[0])
			}
			return err
		})
		admitTrips := rt.n.Load() - trips
		<-done
		ours := time.Since(began)
		stop()
		<-consumed
		ourCmds := commands(b, rdb) - before
		if testing.Verbose() {
			info, _ := rdb.Info(context.Background(), "commandstats").Result()
			b.Log(info)
		}
		rdb.Close()
		apiConn.Close()

		b.ReportMetric(float64(jobs)/plain.Seconds(), "asynq-jobs/s")
		b.ReportMetric(float64(jobs)/ours.Seconds(), "throttler-jobs/s")
		b.ReportMetric(plain.Seconds()/ours.Seconds(), "ratio")
		b.ReportMetric(float64(admitTrips)/jobs, "round-trips/admission")
		b.ReportMetric(float64(plainCmds)/jobs, "asynq-cmds/job")
		b.ReportMetric(float64(ourCmds)/jobs, "throttler-cmds/job")
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
