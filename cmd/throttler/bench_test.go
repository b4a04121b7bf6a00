package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

// BenchmarkEnqueueHTTP measures admissions over HTTP: 64 keep-alive clients
// posting single jobs spread over 1000 tenants, each durable before its 202.
//
//	go test -run '^$' -bench EnqueueHTTP -benchtime 5s ./cmd/throttler
func BenchmarkEnqueueHTTP(b *testing.B) {
	ds := downstreamtest.New(b)
	// Slow tenants with deep queues: everything is admitted and waits, so
	// the benchmark measures admission, not delivery.
	base := startServer(b, writeConfig(b, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 50000\n", ds))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var n, accepted atomic.Int64
	b.SetParallelism(32) // 32 x GOMAXPROCS (2) = 64 clients
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			resp, err := client.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs", base, i%1000), "application/json",
				strings.NewReader(fmt.Sprintf(`{"payload":{"n":%d,"text":"your code is 123456"}}`, i)))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				accepted.Add(1)
			}
		}
	})
	b.StopTimer()
	if accepted.Load() != n.Load() {
		b.Fatalf("accepted %d of %d", accepted.Load(), n.Load())
	}
	b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "admissions/s")
}

// BenchmarkCeilingShare measures how long tenant B waits behind tenant A's
// backlog under a shared downstream ceiling of 10/s (the workload of
// TestCeilingIsSharedFairly): the round robin promises about two intervals
// of the ceiling (200 ms); a busy machine's late timers add to it.
//
//	go test -run '^$' -bench CeilingShare -benchtime 1x -count 3 ./cmd/throttler
func BenchmarkCeilingShare(b *testing.B) {
	var worst time.Duration
	for range b.N {
		_, _, w := shareCeiling(b)
		worst = max(worst, w)
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "B-wait-max-ms")
	b.ReportMetric(float64(worst)/float64(2*ceilingInterval), "B-wait/2T")
}
