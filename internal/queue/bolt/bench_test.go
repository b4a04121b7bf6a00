package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/queue"
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
	var n atomic.Int64
	payload := []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)
	b.SetParallelism(32) // x GOMAXPROCS (2): 64 writers
	b.ResetTimer()
	cpu := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			out, err := s.Enqueue(context.Background(), fmt.Sprintf("t%d", i%1000), []queue.NewJob{{Payload: payload}})
			if err != nil || out[0].Rejected != nil {
				b.Errorf("enqueue: %v %+v", err, out)
				return
			}
		}
	})
	b.StopTimer()
	cpu = processCPU() - cpu
	b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "admissions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n.Load()), "cpu-µs/admission")
	if g := s.groups.Load(); g > 0 {
		b.ReportMetric(float64(s.grouped.Load())/float64(g), "jobs/commit")
	}
}

// BenchmarkHeapPerWaitingJob fills a store with waiting jobs (10^6, or
// THROTTLER_BENCH_JOBS) over 1000 tenants in batches, and reports, per
// waiting job, the Go heap it holds after a collection, the resident memory
// it added (the file's pages it touched included) and the file's size; then
// how long opening the file again takes (recovery reads every waiting job)
// and the heap per job after it.
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
		payload := []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)
		batch := make([]queue.NewJob, 1000)
		for i := range batch {
			batch[i] = queue.NewJob{Payload: payload}
		}
		heap0, rss0 := liveHeap(), rss()
		start := time.Now()
		for n := 0; n < jobs; n += len(batch) {
			out, err := s.Enqueue(context.Background(), fmt.Sprintf("t%d", (n/len(batch))%1000), batch[:min(len(batch), jobs-n)])
			if err != nil || out[0].Rejected != nil {
				b.Fatalf("enqueue: %v %+v", err, out[0])
			}
		}
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
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		// A restart with them all waiting: how long until the dispatcher
		// can hand the first over (Open reads every waiting job).
		heap0 = liveHeap()
		start = time.Now()
		s, err = Open(path, Options{Policy: slowPolicy})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "reopen-s")
		b.ReportMetric(float64(liveHeap()-heap0)/float64(jobs), "reopened-heap-B/job")
		s.Close()
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
