package api

import (
	"net/http"
	"strings"
	"testing"
)

// A job's "type" (for a Go handler, DESIGN.md section 6d) is taken on
// enqueue and batch items, kept, and shown by GET /v1/jobs/{id}; one that
// is not printable ASCII, or too long, is refused naming the field.
func TestJobTypeIsKeptAndShown(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": {"to": "a"}, "type": "email:welcome"}`)
	if status != http.StatusAccepted {
		t.Fatalf("enqueue: %d %v", status, body)
	}
	_, _, job := do(t, h, "GET", "/v1/jobs/"+body["id"].(string), "")
	if job["type"] != "email:welcome" {
		t.Fatalf("GET shows type %v, want email:welcome", job["type"])
	}
	status, _, batch := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs": [{"payload": 1, "type": "sms:otp"}, {"payload": 2}]}`)
	results, _ := batch["results"].([]any)
	if status != http.StatusOK || len(results) != 2 {
		t.Fatalf("batch: %d %v", status, batch)
	}
	for i, want := range []any{"sms:otp", nil} {
		_, _, j := do(t, h, "GET", "/v1/jobs/"+results[i].(map[string]any)["id"].(string), "")
		if j["type"] != want {
			t.Fatalf("batch job %d shows type %v, want %v", i, j["type"], want)
		}
	}
	for _, bad := range []string{`"a\nb"`, `"` + strings.Repeat("x", 257) + `"`} {
		status, _, body = do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "type": `+bad+`}`)
		if status != http.StatusBadRequest || body["error"] != "invalid_type" {
			t.Fatalf("type %s: %d %v, want 400 invalid_type", bad, status, body)
		}
	}
}
