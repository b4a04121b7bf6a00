package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// slowPolicy keeps every job waiting: admission is measured, not delivery.
func slowPolicy(string) leaky.Policy {
	return leaky.Policy{Interval: time.Hour, Burst: 1, Capacity: 80_000}
}

// BenchmarkEnqueueParallel measures durable admissions through the store
// alone: 64 goroutines enqueueing single jobs over 1000 tenants, each
// fsynced before Enqueue returns. CPU per admission (the whole process's,
// the benchmark's goroutines included) moves less than the rate on a
// shared machine.
//
//	go test -run '^$' -bench EnqueueParallel -benchtime 5s ./internal/queue/bolt
func BenchmarkEnqueueParallel(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{Policy: slowPolicy})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	cpu := processCPU()
	n := enqueueParallel(b, s, 1000, []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`))
	b.StopTimer()
	cpu = processCPU() - cpu
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admissions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/admission")
	if g := s.groups.Load(); g > 0 {
		b.ReportMetric(float64(s.grouped.Load())/float64(g), "jobs/commit")
	}
}

// enqueueParallel admits b.N jobs of payload one at a time from 64
// writers (32 x GOMAXPROCS 2), to tenants t0..t{tenants-1} in turn, and
// returns how many it admitted.
func enqueueParallel(b *testing.B, s *Store, tenants int64, payload []byte) int64 {
	var n atomic.Int64
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			out, err := s.Enqueue(context.Background(), fmt.Sprintf("t%d", i%tenants), []queue.NewJob{{Payload: payload}})
			if err != nil || out[0].Rejected != nil {
				b.Errorf("enqueue: %v %+v", err, out)
				return
			}
		}
	})
	return n.Load()
}

// BenchmarkHeapPerWaitingJob fills a store with waiting jobs (10^6, or
// THROTTLER_BENCH_JOBS) over 1000 tenants in batches, and reports, per
// waiting job, the Go heap it holds after a collection, the resident memory
// it added (the file's pages it touched included) and the file's size; then
// how long opening the file again takes, after a clean stop and after a
// crash, and the heap per job after each.
//
//	go test -run '^$' -bench HeapPerWaitingJob -benchtime 1x ./internal/queue/bolt
func BenchmarkHeapPerWaitingJob(b *testing.B) {
	jobs := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("THROTTLER_BENCH_JOBS")); err == nil && v > 0 {
		jobs = v
	}
	for range b.N {
		path := filepath.Join(b.TempDir(), "b.db")
		s, err := Open(path, Options{Policy: slowPolicy})
		if err != nil {
			b.Fatal(err)
		}
		heap0, rss0 := liveHeap(), rss()
		start := time.Now()
		fillBacklog(b, s, jobs)
		took := time.Since(start)
		heap1, rss1 := liveHeap(), rss()
		fi, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		if got := s.sched.len(); got != jobs {
			b.Fatalf("%d waiting, want %d", got, jobs)
		}
		b.ReportMetric(float64(heap1-heap0)/float64(jobs), "heap-B/job")
		b.ReportMetric(float64(rss1-rss0)/float64(jobs), "rss-B/job")
		b.ReportMetric(float64(fi.Size())/float64(jobs), "file-B/job")
		b.ReportMetric(float64(jobs)/took.Seconds(), "admissions/s")
		crashed := filepath.Join(filepath.Dir(path), "crashed.db")
		if err := s.snapshot(crashed); err != nil { // the file as a kill -9 leaves it
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		// A restart with them all waiting: how long until the dispatcher
		// can hand the first over, after a clean stop and after a crash
		// (which walks the file for its free pages and moves the overdue).
		for _, r := range []struct{ path, metric string }{{path, "reopen"}, {crashed, "crash-reopen"}} {
			heap0 = liveHeap()
			start = time.Now()
			s, err = Open(r.path, Options{Policy: slowPolicy})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(start).Seconds(), r.metric+"-s")
			b.ReportMetric(float64(liveHeap()-heap0)/float64(jobs), r.metric+"ed-heap-B/job")
			s.Close()
		}
	}
}

// fillBacklog admits jobs (an SMS-sized payload each) over 1000 tenants,
// in batches of 1000, each admitted whole.
func fillBacklog(b *testing.B, s *Store, jobs int) {
	payload := []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)
	batch := make([]queue.NewJob, 1000)
	for i := range batch {
		batch[i] = queue.NewJob{Payload: payload}
	}
	for n := 0; n < jobs; n += len(batch) {
		out, err := s.Enqueue(context.Background(), fmt.Sprintf("t%d", (n/len(batch))%1000), batch[:min(len(batch), jobs-n)])
		if err != nil || out[0].Rejected != nil {
			b.Fatalf("enqueue: %v %+v", err, out[0])
		}
	}
}

// liveHeap is the Go heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// rss is this process's resident set (0 where /proc is missing).
func rss() int64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// BenchmarkPromptBurst measures how true a prompt job's promise is when it
// comes in a burst after a quiet spell, without HTTP or a downstream: each
// round, 20 calls one at a time (the start lag learns the quiet pipeline),
// then 100 idle tenants' batches of 25 from 32 goroutines at once, as
// `loadgen deliver --tenants 100` sends them. Every tenant's first job can
// go at once and is promised its start lag; the rest of its queue is timed
// from that promise, so a first job handed over after its slot makes the
// whole queue late. Reported: the share of first jobs handed over after
// their slot, how late they were (p50, p99; early counts as zero), and
// the delay a burst's first job was promised (an estimate too long costs
// that).
//
//	go test -run '^$' -bench PromptBurst -benchtime 20x ./internal/queue/bolt
func BenchmarkPromptBurst(b *testing.B) {
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: time.Hour, Burst: 1, Capacity: 100} }
	s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{Policy: policy, InitialStartLag: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	var late, promised []time.Duration
	handed := make(chan struct{}, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		consumed <- s.Consume(ctx, func(_ context.Context, j queue.Job) queue.Outcome {
			now := time.Now()
			mu.Lock()
			late = append(late, max(0, now.Sub(j.DispatchAt)))
			if strings.HasPrefix(j.Tenant, "burst-") {
				promised = append(promised, j.DispatchAt.Sub(j.EnqueuedAt))
			}
			mu.Unlock()
			handed <- struct{}{}
			return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clock.Later(now, j.DispatchAt)}
		}, queue.ConsumeOptions{Lead: queue.DefaultLead, Concurrency: 1024})
	}()
	payload := []byte(`{"n":1}`)
	batch := make([]queue.NewJob, 25)
	for i := range batch {
		batch[i] = queue.NewJob{Payload: payload}
	}
	enqueue := func(tenant string, jobs []queue.NewJob) {
		if out, err := s.Enqueue(context.Background(), tenant, jobs); err != nil || out[0].Rejected != nil {
			b.Errorf("enqueue: %v %+v", err, out)
		}
	}
	var quiet, burst []time.Duration
	take := func(into *[]time.Duration) {
		mu.Lock()
		*into, late = append(*into, late...), late[:0]
		mu.Unlock()
	}
	for round := range b.N {
		for i := range 20 {
			enqueue(fmt.Sprintf("quiet-%d-%d", round, i), batch[:1])
			<-handed
			time.Sleep(5 * time.Millisecond)
		}
		take(&quiet)
		sem := make(chan struct{}, 32)
		var wg sync.WaitGroup
		for i := range 100 {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				enqueue(fmt.Sprintf("burst-%d-%d", round, i), batch)
			})
		}
		wg.Wait()
		for range 100 {
			<-handed
		}
		take(&burst)
	}
	b.StopTimer()
	cancel()
	if err := <-consumed; err != nil {
		b.Fatal(err)
	}
	reportLate := func(ds []time.Duration, name string) {
		slices.Sort(ds)
		n := len(ds)
		after := n - sort.Search(n, func(i int) bool { return ds[i] > 0 })
		b.ReportMetric(100*float64(after)/float64(n), name+"-late-%")
		b.ReportMetric(float64(ds[n/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(ds[n*99/100].Microseconds())/1000, name+"-p99-ms")
	}
	reportLate(burst, "burst")
	reportLate(quiet, "quiet")
	slices.Sort(promised) // what a prompt job in the burst was promised: the estimate's cost
	b.ReportMetric(float64(promised[len(promised)/2].Microseconds())/1000, "burst-promised-p50-ms")
}

// BenchmarkHeapAfterAPeakDrains fills a store with a backlog (10^6 jobs,
// or THROTTLER_BENCH_JOBS, over 1000 fast tenants), delivers it all to a
// handler that answers at once, and reports the Go heap after a collection
// at the start, at the peak and once the backlog is gone, and the last
// over the first: memory follows a backlog down.
//
//	go test -run '^$' -bench HeapAfterAPeakDrains -benchtime 1x ./internal/queue/bolt
func BenchmarkHeapAfterAPeakDrains(b *testing.B) {
	jobs := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("THROTTLER_BENCH_JOBS")); err == nil && v > 0 {
		jobs = v
	}
	fast := func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Microsecond, Burst: 1, Capacity: 10_000_000}
	}
	for range b.N {
		s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{Policy: fast})
		if err != nil {
			b.Fatal(err)
		}
		heap0 := liveHeap()
		fillBacklog(b, s, jobs)
		heap1 := liveHeap()
		var done atomic.Int64
		drained := make(chan struct{})
		ctx, stop := context.WithCancel(context.Background())
		consumed := make(chan error, 1)
		start := time.Now()
		go func() {
			consumed <- s.Consume(ctx, func(_ context.Context, j queue.Job) queue.Outcome {
				if done.Add(1) == int64(jobs) {
					close(drained)
				}
				return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: time.Now()}
			}, queue.ConsumeOptions{Concurrency: 256})
		}()
		<-drained
		took := time.Since(start)
		// Each outcome recorded: the schedule, the claims and the log
		// empty before the heap is read.
		busy := func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.sched.len() > 0 || len(s.claims) > 0
		}
		for busy() {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		if err := <-consumed; err != nil {
			b.Fatal(err)
		}
		heap2 := liveHeap()
		b.ReportMetric(float64(heap0)/(1<<20), "start-heap-MB")
		b.ReportMetric(float64(heap1)/(1<<20), "peak-heap-MB")
		b.ReportMetric(float64(heap2)/(1<<20), "drained-heap-MB")
		b.ReportMetric(float64(heap2)/float64(heap0), "drained/start")
		b.ReportMetric(float64(jobs)/took.Seconds(), "deliveries/s")
		s.Close()
	}
}

// BenchmarkEnqueueScheduled is BenchmarkEnqueueParallel with and without
// a not_before on every job, in the same run: "prompt" admits jobs into
// the queue, "not_before" books each for a time 1 to 25 hours ahead (so
// each tenant's bookings grow as the run goes: about 350 each after 5 s).
//
//	go test -run '^$' -bench 'EnqueueScheduled' -benchtime 5s ./internal/queue/bolt
func BenchmarkEnqueueScheduled(b *testing.B) {
	policy := func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 1_000_000, MaxScheduled: 1_000_000}
	}
	for _, scheduled := range []bool{false, true} {
		name := map[bool]string{false: "prompt", true: "not_before"}[scheduled]
		b.Run(name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{Policy: policy})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var n atomic.Int64
			payload := []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)
			start := time.Now()
			b.SetParallelism(32) // x GOMAXPROCS (2): 64 writers
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

// BenchmarkEnqueueWindowSendsMade is BenchmarkEnqueueParallel for 100
// tenants with a window of 1000 per hour whose lists are full, with and
// without each window's sends made (rules.Record.Sent) full too, in the
// same run: the record written with each admission holds them.
//
//	go test -run '^$' -bench EnqueueWindowSendsMade -benchtime 5s ./internal/queue/bolt
func BenchmarkEnqueueWindowSendsMade(b *testing.B) {
	w, _ := leaky.ParseWindow("1000/h")
	p := leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 1_000_000, Windows: []leaky.Window{w}}
	for _, made := range []bool{false, true} {
		name := "no-sends-made"
		if made {
			name = "1000-sends-made"
		}
		b.Run(name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{Policy: func(string) leaky.Policy { return p }})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			// Full lists, a window's length ago: they bind nothing.
			old := make(leaky.Recent, w.N)
			for i := range old {
				old[i] = time.Now().Add(-2*time.Hour + time.Duration(i)*time.Millisecond)
			}
			s.mu.Lock()
			for i := range 100 {
				tm, err := s.loadTenant(fmt.Sprintf("t%d", i))
				if err != nil {
					b.Fatal(err)
				}
				tm.rec.SetRecent(p, []leaky.Recent{old})
				if made {
					tm.rec.SetMade(p, []leaky.Recent{old})
				}
			}
			s.mu.Unlock()
			b.ResetTimer()
			n := enqueueParallel(b, s, 100, []byte(`{"n":1}`))
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admissions/s")
		})
	}
}
