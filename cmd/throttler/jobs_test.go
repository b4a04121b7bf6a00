package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"throttler/internal/downstreamtest"
	"throttler/internal/testutil"
)

// A job that would wait past its deadline is refused at once (422
// would_expire, nothing queued); one that fits is accepted; one that a
// downstream's pause pushes past its deadline ends expired and is never
// sent, while the jobs around it are delivered.
func TestDeadlines(t *testing.T) {
	ds := downstreamtest.New(t)
	var mu sync.Mutex
	pushed := false
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(readBody(r), `"n":1}`) && !pushed {
			pushed = true
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds))
	var ids []string
	for i := 0; i < 6; i++ {
		body := fmt.Sprintf(`{"payload":{"n":%d}}`, i)
		if i == 3 {
			body = `{"payload":{"n":3},"expires_in":"1s"}` // fits: due in 300 ms
		}
		st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", body)
		if st != 202 {
			t.Fatalf("job %d: %d %v", i, st, a)
		}
		ids = append(ids, a["id"].(string))
	}
	st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":{"n":99},"expires_in":"200ms"}`)
	if st != 422 || a["error"] != "would_expire" || a["expected_delay_ms"].(float64) < 500 {
		t.Fatalf("a job that cannot make its deadline: %d %v", st, a)
	}
	if st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":1,"deadline":"2020-01-01T00:00:00Z"}`); st != 422 || a["error"] != "would_expire" {
		t.Fatalf("a deadline in the past: %d %v", st, a)
	}
	if _, _, ten := call(t, "GET", base+"/v1/tenants/acme", ""); ten["accepted_total"] != 6.0 || ten["queue_depth"].(float64) > 6 {
		t.Fatalf("a refused job was queued: %v", ten)
	}
	expired := ids[3]
	testutil.WaitFor(t, 10*time.Second, "the others delivered", func() bool {
		return allSucceeded(t, base, append(append([]string{}, ids[:3]...), ids[4:]...))
	})
	j := jobState(t, base, expired)
	if j["state"] != "expired" || j["attempts"] != 0.0 || j["deadline"] == nil {
		t.Fatalf("the job pushed past its deadline: %v", j)
	}
	for _, arr := range ds.All() {
		if arr.Key == expired {
			t.Fatal("an expired job was sent")
		}
	}
	if _, _, ten := call(t, "GET", base+"/v1/tenants/acme", ""); ten["expired_total"] != 1.0 || ten["delivered_total"] != 5.0 {
		t.Fatalf("tenant %v", ten)
	}
	m := scrape(t, base)
	if v := value(m, `throttler_jobs_expired_total{downstream="test",tenant="_other"}`); v != 1 {
		t.Fatalf("expired counter %v", v)
	}
	if v := value(m, `throttler_jobs_rejected_total{downstream="test",reason="would_expire",tenant="_other"}`); v != 2 {
		t.Fatalf("would_expire refusals counted %v, want 2", v)
	}
	for _, bad := range []string{`{"payload":1,"expires_in":"soon"}`, `{"payload":1,"deadline":"tomorrow"}`, `{"payload":1,"expires_in":"1s","deadline":"2030-01-01T00:00:00Z"}`, `{"payload":1,"cost":0}`, `{"payload":1,"cost":1.5}`} {
		if st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", bad); st != 400 {
			t.Fatalf("%s: %d %v", bad, st, a)
		}
	}
}

// A cost-3 job then a cost-1 job at 10/s: the second reaches the downstream
// 300 ms after the first, as promised; the queue counts the cost in its
// Retry-After, and a cost it could never hold is 422.
func TestCost(t *testing.T) {
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 3\n", ds))
	st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":{"n":0},"cost":3},{"payload":{"n":1}},{"payload":{"n":2}},{"payload":{"n":3},"cost":5}]}`)
	if st != 200 {
		t.Fatalf("batch: %d %v", st, body)
	}
	res := body["results"].([]any)
	first, second := res[0].(map[string]any), res[1].(map[string]any)
	if first["status"] != 202.0 || second["status"] != 202.0 {
		t.Fatalf("results %v", res)
	}
	if d := second["expected_delay_ms"].(float64); d < 300 || d > 320 {
		t.Fatalf("the job after a cost-3 job is promised %vms, want about 300", d)
	}
	if r := res[2].(map[string]any); r["status"] != 429.0 || r["retry_after_ms"].(float64) > 100 {
		t.Fatalf("third: %v", r)
	}
	if r := res[3].(map[string]any); r["status"] != 422.0 || r["error"] != "cost_too_large" || r["max_cost"] != 4.0 {
		t.Fatalf("cost 5: %v", r)
	}
	testutil.WaitFor(t, 5*time.Second, "both delivered", func() bool { return len(ds.All()) == 2 })
	got := ds.All()
	gap := got[1].At.Sub(got[0].At)
	t.Logf("cost 3 then cost 1: %v apart", gap)
	if j := jobState(t, base, first["id"].(string)); j["cost"] != 3.0 {
		t.Fatalf("job %v", j)
	}
	if testutil.Race {
		return
	}
	if gap < 300*time.Millisecond-downstreamtest.Jitter || gap > 350*time.Millisecond {
		t.Fatalf("second job %v after a cost-3 job at 10/s, want 300ms", gap)
	}
}
