package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/metrics"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// tourConfig has tokens of each role, small body limits, tenants that
// queue for a long time (acme), that are unknown (stranger), and metrics.
var tourConfig = `
[server]
max_body_bytes = 1024
max_batch_bytes = 4096
[tenant_defaults]
rate = "1/h"
capacity = 5
allow_unknown_tenants = false
[tenants.acme]
[tenants.beta]
` + testutil.AuthTokens(
	testutil.Token{Name: "admin", Secret: "admin-token", Role: "admin", Tenants: []string{"*"}},
	testutil.Token{Name: "acme-app", Secret: "acme-token", Role: "producer", Tenants: []string{"acme"}},
	testutil.Token{Name: "viewer", Secret: "viewer-token", Role: "viewer", Tenants: []string{"*"}},
)

// newTour is an API with tourConfig, metrics, and a dispatcher whose
// downstream refuses every job for good (so failed jobs exist to list and
// retry).
func newTour(t *testing.T) http.Handler {
	t.Helper()
	cfg := loadConfig(t, tourConfig)
	h, _ := tourHandler(t, cfg, openStore(t, t.TempDir(), cfg, bolt.Options{}))
	return h
}

// tourHandler is newTour's API over store, with cfg (tourConfig loaded)
// and its downstreams' request rules, as the service wires it; stop stops
// its dispatcher.
func tourHandler(t *testing.T, cfg *config.Config, store *bolt.Store) (h http.Handler, stop func()) {
	t.Helper()
	compiled := compileDownstreams(t, cfg)
	stop = queuetest.Consume(t, store, queue.DefaultLead, func(_ context.Context, j queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 invalid number", SentAt: time.Now()}
	})
	m := metrics.New(store, func(tenant string) (string, string) { return "test", tenant }, func() []string { return []string{"acme"} })
	return New(Options{Store: store, Config: func() *config.Config { return cfg }, Metrics: m,
		Outbound: func(name string) *outbound.Downstream { return compiled[name] }}), stop
}

func bearer(token string) http.Header {
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return h
}

// call is one request of the tour and the status it must get.
type call struct {
	method, path, body, token string
	status                    int
	code                      string // the error code, for error answers
}

func (c call) run(t *testing.T, h http.Handler, extra http.Header) map[string]any {
	t.Helper()
	hdr := bearer(c.token)
	if c.body != "" {
		hdr.Set("Content-Type", "application/json")
	}
	for k, v := range extra {
		hdr[k] = v
	}
	st, _, body := doHeader(t, h, c.method, c.path, c.body, hdr)
	if st != c.status || (c.code != "" && body["error"] != c.code) {
		t.Errorf("%s %s (token %q): %d %v, want %d %s", c.method, c.path, c.token, st, body, c.status, c.code)
	}
	return body
}

// Every route of the API, its answers and its errors, through do: each
// request and answer is checked against openapi.json there. The document
// lists every route (unrouted answers other than the catch-all 404 and 405
// fail do) and this test makes each one answer.
func TestEveryRouteAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	h := newTour(t)
	const admin, acme, viewer = "admin-token", "acme-token", "viewer-token"
	big := strings.Repeat("x", 2000)
	for _, c := range []call{
		{"GET", "/openapi.json", "", "", 200, ""},
		{"GET", "/healthz", "", "", 200, ""},
		{"GET", "/readyz", "", "", 200, ""},
		{"GET", "/", "", "", 200, ""},
		{"GET", "/static/app.js", "", "", 200, ""},
		{"GET", "/metrics", "", admin, 200, ""},
		{"GET", "/metrics", "", acme, 403, "forbidden"},
		{"GET", "/metrics", "", "", 401, "unauthorized"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1}`, "", 401, "unauthorized"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1}`, "wrong", 401, "unauthorized"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1}`, viewer, 403, "forbidden"},
		{"POST", "/v1/tenants/beta/jobs", `{"payload":1}`, acme, 403, "forbidden"},
		{"POST", "/v1/tenants/stranger/jobs", `{"payload":1}`, admin, 404, "unknown_tenant"},
		{"POST", "/v1/tenants/a%20b/jobs", `{"payload":1}`, admin, 400, "invalid_tenant"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":`, acme, 400, "invalid_json"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1,"colour":"red"}`, acme, 400, "unknown_field"},
		{"POST", "/v1/tenants/acme/jobs", `{}`, acme, 400, "missing_payload"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1,"cost":0}`, acme, 400, "invalid_cost"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1,"deadline":"soon"}`, acme, 400, "invalid_deadline"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":"` + big + `"}`, acme, 413, "payload_too_large"},
		{"POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":"` + big + big + big + `"}]}`, acme, 413, "body_too_large"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1,"cost":7}`, acme, 422, "cost_too_large"},
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1,"expires_in":"0s"}`, acme, 422, "would_expire"},
		{"POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[]}`, acme, 400, "invalid_batch"},
		{"GET", "/v1/tenants/acme", "", viewer, 200, ""},
		{"GET", "/v1/tenants/beta", "", acme, 403, "forbidden"},
		{"GET", "/v1/tenants", "", admin, 200, ""},
		{"GET", "/v1/tenants", "", acme, 403, "forbidden"},
		{"GET", "/v1/tenants?limit=0", "", admin, 400, "invalid_parameter"},
		{"GET", "/v1/tenants/acme/jobs?state=queued", "", acme, 400, "invalid_parameter"},
		{"GET", "/v1/jobs/0000000000000000000000000a", "", acme, 404, "job_not_found"},
		{"POST", "/v1/tenants/acme/pause", "", acme, 403, "forbidden"},
		{"PUT", "/v1/tenants/acme/jobs", `{"payload":1}`, acme, 405, "method_not_allowed"},
		{"GET", "/v2/nothing", "", admin, 404, "not_found"},
	} {
		c.run(t, h, nil)
	}
	tourJobs(t, h)
}

// tourJobs walks a job's routes: enqueue (single, repeated, batch), read,
// cancel, the failed list, retry, holds.
func tourJobs(t *testing.T, h http.Handler) {
	const admin, acme = "admin-token", "acme-token"
	key := http.Header{"Idempotency-Key": {"first"}}
	first := call{"POST", "/v1/tenants/acme/jobs", `{"payload":{"to":"+1555"}}`, acme, 202, ""}.run(t, h, key)
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":{"to":"+1555"}}`, acme, 200, ""}.run(t, h, key)
	batch := call{"POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":1},{"payload":2,"cost":2},{"payload":3,"expires_in":"1s"},{"payload":4,"cost":9}]}`, acme, 200, ""}.run(t, h, nil)
	results, _ := batch["results"].([]any)
	var statuses []any
	for _, r := range results {
		statuses = append(statuses, r.(map[string]any)["status"])
	}
	if fmt.Sprint(statuses) != "[202 202 422 422]" {
		t.Errorf("batch statuses %v", statuses)
	}
	// The first job went at once and failed for good; the batch's wait.
	id := fmt.Sprint(first["id"])
	testutil.WaitFor(t, 10*time.Second, "the first job failed", func() bool {
		_, _, j := doHeader(t, h, "GET", "/v1/jobs/"+id, "", bearer(acme))
		return j["state"] == "failed"
	})
	call{"GET", "/v1/jobs/" + id, "", acme, 200, ""}.run(t, h, nil)
	failed := call{"GET", "/v1/tenants/acme/jobs?state=failed&limit=10", "", acme, 200, ""}.run(t, h, nil)
	if jobs, _ := failed["jobs"].([]any); len(jobs) != 1 {
		t.Errorf("failed jobs: %v", failed)
	}
	call{"DELETE", "/v1/jobs/" + id, "", acme, 409, "not_cancellable"}.run(t, h, nil)
	waiting := fmt.Sprint(results[0].(map[string]any)["id"])
	call{"POST", "/v1/jobs/" + waiting + "/retry", "", acme, 409, "not_retryable"}.run(t, h, nil)
	call{"DELETE", "/v1/jobs/" + waiting, "", acme, 200, ""}.run(t, h, nil)
	call{"POST", "/v1/jobs/" + id + "/retry", "", acme, 202, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":5}`, acme, 202, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/acme/jobs", `{"payload":6}`, acme, 429, "queue_full"}.run(t, h, nil)
	// Clients send {} as often as nothing: the document allows both.
	call{"POST", "/v1/tenants/acme/pause", "{}", admin, 200, ""}.run(t, h, nil)
	call{"POST", "/v1/tenants/acme/resume", "", admin, 200, ""}.run(t, h, nil)
}

// The document refuses answers that change shape: a real answer passes,
// and each change of it (a field renamed, gone, of another type, added; a
// status or an error code it does not list; a RateLimit field malformed)
// is refused. This is what makes every test of the package a test of the
// document.
func TestDocumentRefusesAChangedAnswer(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	req := `{"payload":1}`
	reqHeader := http.Header{"Content-Type": {"application/json"}}
	st, hdr, body := do(t, h, "POST", "/v1/tenants/acme/jobs", req)
	if st != 202 {
		t.Fatalf("enqueue: %d %v", st, body)
	}
	check := func(status int, header http.Header, body map[string]any) error {
		raw, _ := json.Marshal(body)
		return checkExchange("POST", "/v1/tenants/acme/jobs", req, reqHeader, status, header, raw)
	}
	if err := check(st, hdr, body); err != nil {
		t.Fatalf("the real answer: %v", err)
	}
	with := func(change func(m map[string]any)) map[string]any {
		m := map[string]any{}
		for k, v := range body {
			m[k] = v
		}
		change(m)
		return m
	}
	header := func(k, v string) http.Header { c := hdr.Clone(); c.Set(k, v); return c }
	for name, c := range map[string]struct {
		status int
		header http.Header
		body   map[string]any
	}{
		"a field renamed":         {202, hdr, with(func(m map[string]any) { m["depth"] = m["queue_depth"]; delete(m, "queue_depth") })},
		"a field gone":            {202, hdr, with(func(m map[string]any) { delete(m, "dispatch_at") })},
		"a field of another type": {202, hdr, with(func(m map[string]any) { m["expected_delay_ms"] = "0ms" })},
		"a field added":           {202, hdr, with(func(m map[string]any) { m["priority"] = 1 })},
		"a state not listed":      {202, hdr, with(func(m map[string]any) { m["state"] = "waiting" })},
		"a status not listed":     {201, hdr, body},
		"an error code not listed": {429, header("Retry-After", "1"), map[string]any{"error": "too_many", "message": "m",
			"retry_after_ms": 1, "queue_depth": 1, "capacity": 1}},
		"RateLimit malformed":   {202, header("RateLimit", "r=1"), body},
		"RateLimit-Policy gone": {202, header("RateLimit-Policy", ""), body},
	} {
		if c.header.Get("RateLimit-Policy") == "" {
			c.header.Del("RateLimit-Policy")
		}
		if err := check(c.status, c.header, c.body); err == nil {
			t.Errorf("%s: the document took it", name)
		} else {
			t.Logf("%s: refused: %.150s", name, firstLine(err.Error()))
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// The document served is the one embedded, and it is valid OpenAPI 3.1.
func TestOpenAPIDocumentServed(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q: want 3.1.0", doc.OpenAPI)
	}
	st, hdr, _ := do(t, h, "GET", "/openapi.json", "")
	if st != 200 || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %d %s", st, hdr.Get("Content-Type"))
	}
	rec := serve(h, "GET", "/openapi.json")
	if !bytes.Equal(rec, openAPI) {
		t.Fatal("GET /openapi.json is not the embedded document")
	}
}
