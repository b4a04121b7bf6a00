package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
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

// Where the process knows its Go handlers (Options.HandlesType), a job of
// a type its downstream's handler does not take is refused, 422
// unknown_type naming the part, as the document has it; in a batch, that
// job alone. A downstream that is a URL takes any type.
func TestUnknownTypeIsRefusedAtAdmission(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, `
[downstreams.tasks]
handler = "tasks"
[downstreams.web]
url = "http://127.0.0.1:9/send"
[tenant_defaults]
downstream = "tasks"
[tenants.site]
downstream = "web"
`)
	store := openStore(t, t.TempDir(), cfg, bolt.Options{})
	h := New(Options{Store: store, Config: func() *config.Config { return cfg },
		HandlesType: func(handler, downstream, typ string) bool { return handler == "tasks" && typ == "email:welcome" }})
	status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "type": "fax:send"}`)
	if msg, _ := body["message"].(string); status != http.StatusUnprocessableEntity || body["error"] != "unknown_type" || body["part"] != "type" || !strings.Contains(msg, `"fax:send"`) {
		t.Fatalf("an unknown type: %d %v, want 422 unknown_type naming it", status, body)
	}
	status, _, body = do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs": [{"payload": 1, "type": "email:welcome"}, {"payload": 2}]}`)
	results, _ := body["results"].([]any)
	if status != http.StatusOK || len(results) != 2 || results[0].(map[string]any)["status"] != 202.0 || results[1].(map[string]any)["error"] != "unknown_type" {
		t.Fatalf("batch: %d %v, want the known type admitted, the job without one refused", status, body)
	}
	if status, _, body = do(t, h, "POST", "/v1/tenants/site/jobs", `{"payload": 1, "type": "fax:send"}`); status != http.StatusAccepted {
		t.Fatalf("a URL downstream's job with a type: %d %v", status, body)
	}
}
