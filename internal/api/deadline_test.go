package api

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// A deadline that has already passed is answered 422 would_expire, never
// taken as "no deadline": the zero time and times
// before 1970 were read as none by the stores.
func TestPastDeadlineIsWouldExpire(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	past := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	for _, field := range []string{
		`"deadline":"0001-01-01T00:00:00Z"`,
		`"deadline":"0000-01-01T00:00:00+01:00"`,
		`"deadline":"1960-06-01T00:00:00Z"`,
		`"deadline":"1970-01-01T00:00:00Z"`,
		`"deadline":"` + past + `"`,
		`"expires_in":"0s"`,
		`"expires_in":"-5s"`,
	} {
		st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":1,`+field+`}`)
		if st != http.StatusUnprocessableEntity || body["error"] != "would_expire" || body["message"] == "" || body["deadline"] == nil || body["expected_delay_ms"] == nil {
			t.Errorf("%s: %d %v, want 422 would_expire with its deadline and expected delay", field, st, body)
		}
	}
	if _, _, tenant := do(t, h, "GET", "/v1/tenants/acme", ""); tenant["queue_depth"] != 0.0 || tenant["accepted_total"] != 0.0 {
		t.Errorf("a job past its deadline was taken: %v", tenant)
	}
}

// The refusal has the shape of the store's own would_expire, and in a batch
// it is that job's answer alone.
func TestPastDeadlineInABatch(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	// The store's would_expire: the second job waits a second (1/s), past
	// its deadline.
	do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":0}`)
	soon := time.Now().Add(100 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	st, _, byStore := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":0,"deadline":"`+soon+`"}`)
	if st != http.StatusUnprocessableEntity || byStore["error"] != "would_expire" {
		t.Fatalf("the store's would_expire: %d %v", st, byStore)
	}
	_, _, byAPI := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":0,"deadline":"0001-01-01T00:00:00Z"}`)
	if !slices.Equal(sortedKeys(byAPI), sortedKeys(byStore)) {
		t.Errorf("fields %v, the store's %v", sortedKeys(byAPI), sortedKeys(byStore))
	}

	st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[
		{"payload":1,"deadline":"0001-01-01T00:00:00Z"},
		{"payload":2},
		{"payload":3,"expires_in":"0s"},
		{"payload":4,"deadline":"1969-12-31T23:59:59Z"}]}`)
	if st != http.StatusOK {
		t.Fatalf("batch: %d %v", st, body)
	}
	results, _ := body["results"].([]any)
	var got []string
	for _, r := range results {
		m := r.(map[string]any)
		got = append(got, fmt.Sprint(m["status"], " ", m["error"]))
		if m["status"] == 422.0 && !slices.Equal(sortedKeys(m), append(sortedKeys(byStore), "status")) {
			t.Errorf("batch 422 fields %v, want the store's and status", sortedKeys(m))
		}
	}
	want := []string{"422 would_expire", "202 <nil>", "422 would_expire", "422 would_expire"}
	if !slices.Equal(got, want) {
		t.Errorf("batch answers %v, want %v", got, want)
	}
}

func sortedKeys(m map[string]any) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// A repeat of an idempotency key gets the first answer even once the
// job's deadline has passed: the store looks the key up before it judges
// the deadline.
func TestRepeatAfterTheDeadlineGetsTheFirstAnswer(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	deadline := time.Now().Add(300 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	req := `{"payload":1,"idempotency_key":"otp-1","deadline":"` + deadline + `"}`
	st, _, first := do(t, h, "POST", "/v1/tenants/acme/jobs", req)
	if st != http.StatusAccepted {
		t.Fatalf("first: %d %v", st, first)
	}
	d, _ := time.Parse(time.RFC3339Nano, deadline)
	time.Sleep(time.Until(d) + 10*time.Millisecond) // the deadline passes: that is what this test is about
	st, _, again := do(t, h, "POST", "/v1/tenants/acme/jobs", req)
	if st != http.StatusOK || again["id"] != first["id"] {
		t.Fatalf("repeat after the deadline: %d %v, want 200 with id %v", st, again, first["id"])
	}
}
