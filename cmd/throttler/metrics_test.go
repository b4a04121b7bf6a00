package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// After a scripted run (accept, refuse, deliver, retry, fail), the counters
// have exactly the expected values, and depth and delay match the API.
func TestMetricsAfterAScriptedRun(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		body := readBody(r)
		switch {
		case strings.Contains(body, "bad"):
			http.Error(w, "no such number", 400)
		case strings.Contains(body, "flaky") && r.Header.Get("X-Throttler-Attempt") == "1":
			http.Error(w, "try later", 502)
		default:
			w.WriteHeader(200)
		}
	})
	base := startServer(t, writeConfig(t, `
[tenant_defaults]
rate = "50/s"
capacity = 2
[tenants.acme]
[tenants.slowpoke]
rate = "1/h"
capacity = 10
`, ds))
	// One batch: four decisions at one instant, whatever the machine's speed.
	if st, _, b := call(t, "POST", base+"/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":"ok"},{"payload":"bad"},{"payload":"flaky"},{"payload":"refused"}]}`); st != 200 {
		t.Fatalf("batch: %d %v", st, b)
	}
	call(t, "POST", base+"/v1/tenants/dyn-1/jobs", `{"payload":"ok"}`)
	for i := 0; i < 3; i++ {
		call(t, "POST", base+"/v1/tenants/slowpoke/jobs", `{"payload":"ok"}`)
	}
	testutil.WaitFor(t, 10*time.Second, "the jobs due finished", func() bool {
		_, _, b := call(t, "GET", base+"/v1/tenants/acme", "")
		_, _, d := call(t, "GET", base+"/v1/tenants/dyn-1", "")
		_, _, s := call(t, "GET", base+"/v1/tenants/slowpoke", "")
		return b["delivered_total"] == 2.0 && b["failed_total"] == 1.0 && d["delivered_total"] == 1.0 && s["delivered_total"] == 1.0
	})
	m := scrape(t, base)
	for series, want := range map[string]float64{
		`throttler_jobs_accepted_total{downstream="test",tenant="acme"}`:                     3,
		`throttler_jobs_rejected_total{downstream="test",reason="queue_full",tenant="acme"}`: 1,
		`throttler_jobs_delivered_total{downstream="test",tenant="acme"}`:                    2,
		`throttler_jobs_failed_total{downstream="test",tenant="acme"}`:                       1,
		`throttler_jobs_retried_total{downstream="test",tenant="acme"}`:                      1,
		`throttler_jobs_accepted_total{downstream="test",tenant="_other"}`:                   1,
		`throttler_jobs_accepted_total{downstream="test",tenant="slowpoke"}`:                 3,
		`throttler_attempts_total{class="4xx",downstream="test"}`:                            1,
		`throttler_attempts_total{class="5xx",downstream="test"}`:                            1,
		`throttler_queue_depth{downstream="test",tenant="acme"}`:                             0,
		`throttler_queue_depth{downstream="test",tenant="slowpoke"}`:                         2,
		`throttler_dispatch_error_seconds_count{downstream="test"}`:                          value(m, `throttler_attempts_total{class="2xx",downstream="test"}`) + 2,
	} {
		if got := value(m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// Depth and delay agree with the API.
	_, _, slow := call(t, "GET", base+"/v1/tenants/slowpoke", "")
	if d := value(m, `throttler_expected_delay_seconds{downstream="test",tenant="slowpoke"}`); d < slow["expected_delay_ms"].(float64)/1000-1 || d > slow["expected_delay_ms"].(float64)/1000+1 {
		t.Errorf("expected delay %v s, the API says %v ms", d, slow["expected_delay_ms"])
	}
	if slow["queue_depth"] != 2.0 {
		t.Errorf("API depth %v", slow["queue_depth"])
	}
}

var tenantLabel = regexp.MustCompile(`^throttler_[a-z_]+\{[^}]*tenant="([^"]*)"`)

// 10,000 tenants not named in config make no series of their own.
func TestDynamicTenantsMakeNoSeries(t *testing.T) {
	testutil.SkipShort(t, "load test: 10,000 tenants")
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\n[tenants.named-one]\n", ds))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := 0; i < 10000; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := httpClient.Post(fmt.Sprintf("%s/v1/tenants/dyn-%d/jobs", base, i), "application/json", strings.NewReader(`{"payload":1}`))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	call(t, "POST", base+"/v1/tenants/named-one/jobs", `{"payload":1}`)
	m := scrape(t, base)
	labels := map[string]bool{}
	series := 0
	for _, line := range strings.Split(m, "\n") {
		if mm := tenantLabel.FindStringSubmatch(line); mm != nil {
			labels[mm[1]] = true
			series++
		}
	}
	if len(labels) != 2 || !labels["_other"] || !labels["named-one"] {
		t.Fatalf("tenant labels %v", labels)
	}
	if v := value(m, `throttler_jobs_accepted_total{downstream="test",tenant="_other"}`); v != 10000 {
		t.Fatalf("accepted for _other: %v", v)
	}
	t.Logf("%d series with a tenant label after 10,000 dynamic tenants", series)
}
