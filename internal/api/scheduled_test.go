package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// Scheduled sends through the API: a not_before or a delay books the job
// for then, promised; the job and its tenant say so; a cancel gives its
// count back; the refusals are the documented ones, each with its fields
// and no Retry-After for schedule_full; bad input is 400 naming the field.
func TestScheduledSendsThroughTheAPI(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC))
	h, _ := newAPIConfig(t, "[tenant_defaults]\nrate = \"1/s\"\nmax_scheduled = 2\nschedule_horizon = \"24h\"\n", clk)
	at := clk.Now().Add(12 * time.Hour).Format(time.RFC3339)
	st, hdr, a := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":1,"not_before":"`+at+`"}`)
	if st != http.StatusAccepted || a["state"] != "scheduled" || a["not_before"] != at || a["dispatch_at"] != at ||
		a["expected_delay_ms"] != float64(12*time.Hour/time.Millisecond) || a["queue_depth"] != 0.0 {
		t.Fatalf("a job not before %s: %d %v", at, st, a)
	}
	if hdr.Get("Retry-After") != "" {
		t.Errorf("a 202 with Retry-After %q", hdr.Get("Retry-After"))
	}
	st, _, b := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":2,"delay":"12h"}`)
	if want := clk.Now().Add(12*time.Hour + time.Second).Format(time.RFC3339); st != http.StatusAccepted || b["state"] != "scheduled" || b["dispatch_at"] != want {
		t.Fatalf("a job with a delay of 12h beside it: %d %v, want it booked one interval after, at %s", st, b, want)
	}
	// Prompt jobs take the queue's places as if nothing were scheduled.
	if st, _, p := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":3,"not_before":"`+clk.Now().Add(-time.Minute).Format(time.RFC3339)+`"}`); st != http.StatusAccepted || p["state"] != "queued" || p["not_before"] != nil || p["queue_depth"] != 1.0 {
		t.Errorf("a job whose not_before has passed: %d %v, want an ordinary one", st, p)
	}
	_, _, tenant := do(t, h, "GET", "/v1/tenants/acme", "")
	if tenant["scheduled"] != 2.0 || tenant["max_scheduled"] != 2.0 || tenant["queue_depth"] != 1.0 {
		t.Errorf("tenant %v: want 2 scheduled of 2, 1 in the queue", tenant)
	}
	_, _, job := do(t, h, "GET", "/v1/jobs/"+a["id"].(string), "")
	if job["state"] != "scheduled" || job["not_before"] != at {
		t.Errorf("GET of the scheduled job: %v", job)
	}
	st, hdr, full := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":4,"delay":"1h"}`)
	if st != http.StatusTooManyRequests || full["error"] != "schedule_full" || full["scheduled"] != 2.0 || full["max_scheduled"] != 2.0 || full["tenant"] != "acme" || hdr.Get("Retry-After") != "" {
		t.Errorf("a third scheduled job with max_scheduled 2: %d %v (Retry-After %q)", st, full, hdr.Get("Retry-After"))
	}
	if st, _, _ := do(t, h, "DELETE", "/v1/jobs/"+b["id"].(string), ""); st != http.StatusOK {
		t.Fatalf("cancel of a scheduled job: %d", st)
	}
	if st, _, again := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":4,"delay":"1h"}`); st != http.StatusAccepted || again["state"] != "scheduled" {
		t.Errorf("after a cancel gave its count back: %d %v", st, again)
	}
	far := clk.Now().Add(25 * time.Hour).Format(time.RFC3339)
	st, _, tooFar := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":5,"not_before":"`+far+`"}`)
	if st != http.StatusUnprocessableEntity || tooFar["error"] != "too_far_ahead" || tooFar["not_before"] != far || tooFar["schedule_horizon"] != "24h0m0s" || tooFar["tenant"] != "acme" {
		t.Errorf("a job 25h ahead with a horizon of 24h: %d %v", st, tooFar)
	}
	st, _, late := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":6,"delay":"2h","expires_in":"1h"}`)
	if st != http.StatusUnprocessableEntity || late["error"] != "would_expire" {
		t.Errorf("a job whose deadline comes before its not_before: %d %v", st, late)
	}
	for _, body := range []string{
		`{"payload":7,"not_before":"tomorrow"}`,
		`{"payload":7,"delay":"-5m"}`,
		`{"payload":7,"delay":"soon"}`,
		`{"payload":7,"delay":"1h","not_before":"` + at + `"}`,
	} {
		if st, _, bad := do(t, h, "POST", "/v1/tenants/acme/jobs", body); st != http.StatusBadRequest || bad["error"] != "invalid_not_before" {
			t.Errorf("%s: %d %v, want 400 invalid_not_before", body, st, bad)
		}
	}
	// In a batch, each job its own answer.
	st, _, batch := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":8,"not_before":"`+far+`"},{"payload":9,"delay":"30m"},{"payload":10}]}`)
	results, _ := batch["results"].([]any)
	if st != http.StatusOK || len(results) != 3 {
		t.Fatalf("batch: %d %v", st, batch)
	}
	codes := []any{results[0].(map[string]any)["error"], results[1].(map[string]any)["error"], results[2].(map[string]any)["state"]}
	if codes[0] != "too_far_ahead" || codes[1] != "schedule_full" || codes[2] != "queued" {
		t.Errorf("batch answers %v: want too_far_ahead, schedule_full, queued", codes)
	}
}
