package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"throttler/internal/downstreamtest"
	"throttler/internal/servicetest"
	"throttler/internal/testutil"
)

// A rate lowered by SIGHUP with a backlog waiting: 20/s with 18 jobs
// waiting, reloaded to 1/s, downstream timeout 1 s. The jobs scheduled at
// the old rate wait at the gate, the last ones for longer than 11 s (the
// timeout plus the 10 s that once bounded a whole attempt). Waiting there is
// never an attempt and never a failure: every job reaches the downstream
// once, on its first attempt, in order, one second apart once the new rate
// applies; nothing is retried, times out or opens the breaker.
func TestLoweredRateBacklogIsDeliveredAtTheNewPace(t *testing.T) {
	const n = 18
	ds := downstreamtest.New(t)
	file := servicetest.WriteConfig(t, "[tenant_defaults]\ncapacity = 100\n[tenants.acme]\nrate = \"20/s\"\n", ds.URL)
	raw, _ := os.ReadFile(file)
	config := strings.Replace(string(raw), `timeout = "2s"`, `timeout = "1s"`, 1)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, file)

	var ids []string
	for range n {
		st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":1}`)
		if st != 202 {
			t.Fatalf("enqueue: %d %v", st, body)
		}
		ids = append(ids, body["id"].(string))
	}
	if err := os.WriteFile(file, []byte(strings.Replace(config, `rate = "20/s"`, `rate = "1/s"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the reload", func() bool { return strings.Contains(p.logs(), "config reloaded") })

	// At most n seconds at the new rate, and a little more for the sends
	// that went at the old one; a job retried after a failure (backoff, the
	// breaker's cooldown) comes later than this.
	testutil.WaitFor(t, (n+2)*time.Second, "every job at the downstream", func() bool { return len(ds.All()) >= n })
	a := ds.All()
	for i, x := range a {
		if i >= len(ids) || x.Key != ids[i] || x.Attempt != "1" {
			t.Fatalf("arrival %d: job %s attempt %s; want every job once, first attempt, in order %v", i, x.Key, x.Attempt, ids)
		}
	}
	// The sends handed over before the reload went 50 ms apart; from the
	// first send at the new rate on, they are 1 s apart.
	first := 1
	for first < n && a[first].At.Sub(a[first-1].At) < 500*time.Millisecond {
		first++
	}
	if first > 6 {
		t.Fatalf("%d sends at the old rate after the reload", first)
	}
	if !testutil.Race {
		downstreamtest.CheckWindows(t, a[first-1:], time.Second, 1)
	}
	if span := a[n-1].At.Sub(a[first-1].At); span > time.Duration(n-first)*time.Second+time.Second {
		t.Errorf("%d sends at 1/s took %v", n-first+1, span)
	}
	// The last outcome is recorded a moment after its request arrives.
	delivered := `throttler_jobs_delivered_total{downstream="test",tenant="acme"}`
	var m string
	testutil.WaitFor(t, 5*time.Second, "the last outcome in the metrics", func() bool {
		m = scrape(t, p.base)
		return value(m, delivered) >= n
	})
	for series, want := range map[string]float64{
		`throttler_jobs_delivered_total{downstream="test",tenant="acme"}`:      n,
		`throttler_jobs_retried_total{downstream="test",tenant="acme"}`:        -1, // never counted: no series
		`throttler_attempts_total{class="2xx",downstream="test"}`:              n,
		`throttler_attempts_total{class="connection_error",downstream="test"}`: -1,
		`throttler_attempts_total{class="timeout",downstream="test"}`:          -1,
		`throttler_breaker_open{downstream="test"}`:                            0,
	} {
		if got := value(m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}
