package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

// vendorConfig has a form vendor that lets jobs pick paths under /v1/,
// POST or GET, and Stripe-Account (tenant acme), a raw one (tenant plain)
// and a GET one (tenant reader). Its token comes from a file: %s.
const vendorConfig = `
[tenant_defaults]
rate = "1/h"
capacity = 20
allow_unknown_tenants = false
downstream = "vendor"
[downstreams.vendor]
url = "https://api.vendor.example/v1/charges?api=2"
body = "form"
job_paths = ["/v1/*", "/health"]
job_methods = ["GET", "DELETE"]
job_headers = ["Stripe-Account"]
auth = { type = "bearer", token_file = %q }
[downstreams.plain]
url = "https://hooks.example/in"
body = "raw"
[downstreams.reader]
url = "https://api.reader.example/v1/status"
method = "GET"
[tenants.acme]
[tenants.plain]
downstream = "plain"
[tenants.reader]
downstream = "reader"
`

// newVendorAPI is an API on its own store whose admission checks jobs
// against vendorConfig's downstreams, compiled as the service does.
func newVendorAPI(t *testing.T) (http.Handler, *bolt.Store) {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("sk_test_api_9d2c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, fmt.Sprintf(vendorConfig, tokenFile))
	compiled := compileDownstreams(t, cfg)
	store := openStore(t, t.TempDir(), cfg, bolt.Options{})
	h := New(Options{Store: store, Config: func() *config.Config { return cfg },
		Outbound: func(name string) *outbound.Downstream { return compiled[name] }})
	return h, store
}

// depth is the tenant's queue depth and accepted total, as the API says.
func depth(t *testing.T, h http.Handler, tenant string) string {
	t.Helper()
	_, _, body := do(t, h, "GET", "/v1/tenants/"+tenant, "")
	return fmt.Sprintf("depth %v accepted %v", body["queue_depth"], body["accepted_total"])
}

// Each job its downstream cannot send is refused at admission, 422 with
// the code and the part named, and nothing is queued.
func TestAdmissionRefusesWhatTheDownstreamCannotSend(t *testing.T) {
	t.Parallel()
	h, _ := newVendorAPI(t)
	for _, c := range []struct {
		name, tenant, body, code, part string
	}{
		{"form body from an array", "acme", `{"payload":["a","b"]}`, "payload_not_encodable", "payload"},
		{"form body from a string", "acme", `{"payload":"To=+1555"}`, "payload_not_encodable", "payload"},
		{"raw body from an object", "plain", `{"payload":{"text":"hi"}}`, "payload_not_encodable", "payload"},
		{"raw body from a number", "plain", `{"payload":42}`, "payload_not_encodable", "payload"},
		{"a body on GET", "acme", `{"payload":{"a":1},"request":{"method":"GET","path":"/v1/charges/ch_1"}}`, "payload_not_encodable", "payload"},
		{"a body on the downstream's GET", "reader", `{"payload":{"a":1}}`, "payload_not_encodable", "payload"},
		{"a method not allowed", "acme", `{"payload":{"a":1},"request":{"method":"PUT"}}`, "request_not_allowed", "request.method"},
		{"a path outside job_paths", "acme", `{"payload":{"a":1},"request":{"path":"/v2/refunds"}}`, "request_not_allowed", "request.path"},
		{"a path by the prefix's text alone", "acme", `{"payload":{"a":1},"request":{"path":"/healthz"}}`, "request_not_allowed", "request.path"},
		{"a .. segment", "acme", `{"payload":{"a":1},"request":{"path":"/v1/../admin"}}`, "request_not_allowed", "request.path"},
		{"an escaped .. segment", "acme", `{"payload":{"a":1},"request":{"path":"/v1/%2e%2e/admin"}}`, "request_not_allowed", "request.path"},
		{"a // segment", "acme", `{"payload":{"a":1},"request":{"path":"/v1//refunds"}}`, "request_not_allowed", "request.path"},
		{"a relative path", "acme", `{"payload":{"a":1},"request":{"path":"v1/refunds"}}`, "request_not_allowed", "request.path"},
		{"another host", "acme", `{"payload":{"a":1},"request":{"path":"//evil.example/v1/x"}}`, "request_not_allowed", "request.path"},
		{"a query in the path", "acme", `{"payload":{"a":1},"request":{"path":"/v1/refunds?x=1"}}`, "request_not_allowed", "request.path"},
		{"a query the url sets", "acme", `{"payload":{"a":1},"request":{"query":{"api":"3"}}}`, "request_not_allowed", "request.query.api"},
		{"a header not allowed", "acme", `{"payload":{"a":1},"request":{"headers":{"X-Other":"1"}}}`, "request_not_allowed", "request.headers.X-Other"},
		{"Authorization", "acme", `{"payload":{"a":1},"request":{"headers":{"authorization":"Bearer mine"}}}`, "request_not_allowed", "request.headers.authorization"},
		{"X-Throttler-*, any case", "acme", `{"payload":{"a":1},"request":{"headers":{"X-THROTTLER-TENANT":"other"}}}`, "request_not_allowed", "request.headers.X-THROTTLER-TENANT"},
		{"the idempotency header", "acme", `{"payload":{"a":1},"request":{"headers":{"idempotency-key":"k"}}}`, "request_not_allowed", "request.headers.idempotency-key"},
		{"Content-Type", "acme", `{"payload":{"a":1},"request":{"headers":{"content-type":"text/plain"}}}`, "request_not_allowed", "request.headers.content-type"},
		{"webhook-*", "acme", `{"payload":{"a":1},"request":{"headers":{"Webhook-Signature":"v1,x"}}}`, "request_not_allowed", "request.headers.Webhook-Signature"},
		{"CR LF in a value", "acme", `{"payload":{"a":1},"request":{"headers":{"Stripe-Account":"acct_1\r\nX-Evil: 1"}}}`, "request_not_allowed", "request.headers.Stripe-Account"},
		{"LF in a value", "acme", `{"payload":{"a":1},"request":{"headers":{"stripe-account":"acct_1\nX"}}}`, "request_not_allowed", "request.headers.stripe-account"},
		{"any path on a downstream without job_paths", "plain", `{"payload":"hi","request":{"path":"/in"}}`, "request_not_allowed", "request.path"},
	} {
		before := depth(t, h, c.tenant)
		st, _, body := do(t, h, "POST", "/v1/tenants/"+c.tenant+"/jobs", c.body)
		msg, _ := body["message"].(string)
		if st != http.StatusUnprocessableEntity || body["error"] != c.code || body["part"] != c.part || !strings.Contains(msg, "nothing was queued") {
			t.Errorf("%s: %d %v, want 422 %s naming %s", c.name, st, body, c.code, c.part)
		}
		if strings.Contains(msg, "X-Evil") || strings.Contains(msg, "Bearer mine") {
			t.Errorf("%s: the message echoes a header's value: %q", c.name, msg)
		}
		if after := depth(t, h, c.tenant); after != before {
			t.Errorf("%s: queued anyway: %s, then %s", c.name, before, after)
		}
	}
}

// A batch's jobs are checked one by one: a job refused has its 422 and
// part in its place, and the others are queued. A relative path is such a
// refusal, not a malformed batch (the document's schema takes it, and its
// description says 422).
func TestBatchRefusesOnlyTheJobsNotAllowed(t *testing.T) {
	t.Parallel()
	h, _ := newVendorAPI(t)
	st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs":[
		{"payload":{"amount":100}},
		{"payload":[1,2]},
		{"payload":{"charge":"ch_1"},"request":{"path":"/v1/refunds","headers":{"Stripe-Account":"acct_1"}}},
		{"payload":{"a":1},"request":{"path":"/v1/../x"}},
		{"payload":{"a":1},"request":{"path":"v1/refunds"}},
		{"payload":{"a":1},"request":{"headers":{"Authorization":"Basic eDp5"}}},
		{"request":{"method":"get","path":"/v1/charges/ch_1","query":{"expand[]":["customer","invoice"]}}}]}`)
	if st != 200 {
		t.Fatalf("batch: %d %v", st, body)
	}
	var got []string
	for _, r := range body["results"].([]any) {
		r := r.(map[string]any)
		got = append(got, fmt.Sprintf("%v %v", r["status"], r["part"]))
	}
	want := "[202 <nil> 422 payload 202 <nil> 422 request.path 422 request.path 422 request.headers.Authorization 202 <nil>]"
	if fmt.Sprint(got) != want {
		t.Fatalf("results %v\nwant %s", got, want)
	}
	if d := depth(t, h, "acme"); d != "depth 3 accepted 3" {
		t.Fatalf("after the batch: %s, want the 3 allowed queued", d)
	}
}

// A job's request is kept with it and shown by GET /v1/jobs/{id}, as it was
// admitted (its method in capitals); a GET goes without a payload, a POST
// does not.
func TestJobShowsItsRequest(t *testing.T) {
	t.Parallel()
	h, _ := newVendorAPI(t)
	st, _, adm := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":{"charge":"ch_1","amount":500},"request":{"path":"/v1/refunds","query":{"expand[]":"charge"},"headers":{"stripe-account":"acct_1"}}}`)
	if st != 202 {
		t.Fatalf("enqueue: %d %v", st, adm)
	}
	_, _, j := do(t, h, "GET", "/v1/jobs/"+adm["id"].(string), "")
	if got, _ := json.Marshal(j["request"]); string(got) != `{"headers":{"stripe-account":"acct_1"},"path":"/v1/refunds","query":{"expand[]":["charge"]}}` {
		t.Fatalf("job's request: %s", got)
	}
	if _, ok := j["response"]; ok {
		t.Fatalf("a job not sent shows a response: %v", j)
	}
	st, _, adm = do(t, h, "POST", "/v1/tenants/acme/jobs", `{"request":{"method":"delete","path":"/v1/customers/cus_1"}}`)
	if st != 202 {
		t.Fatalf("a DELETE without a payload: %d %v", st, adm)
	}
	_, _, j = do(t, h, "GET", "/v1/jobs/"+adm["id"].(string), "")
	if got, _ := json.Marshal(j["request"]); string(got) != `{"method":"DELETE","path":"/v1/customers/cus_1"}` {
		t.Fatalf("DELETE job's request: %s", got)
	}
	if st, _, body := do(t, h, "POST", "/v1/tenants/reader/jobs", `{}`); st != 202 {
		t.Fatalf("a job of a GET downstream without a payload: %d %v", st, body)
	}
	if st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"request":{"path":"/v1/refunds"}}`); st != 400 || body["error"] != "missing_payload" {
		t.Fatalf("a POST without a payload: %d %v", st, body)
	}
	_, _, plain := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":{"a":1},"request":{}}`)
	if _, _, j := do(t, h, "GET", "/v1/jobs/"+plain["id"].(string), ""); j["request"] != nil {
		t.Fatalf("an empty request is kept: %v", j["request"])
	}
}

// A request that is not JSON of the right shape is a 400 that says what a
// request holds.
func TestMalformedRequestIs400(t *testing.T) {
	t.Parallel()
	h, _ := newVendorAPI(t)
	for body, want := range map[string]string{
		`{"payload":1,"request":{"colour":"red"}}`:          `"method", "path", "query" and "headers"`,
		`{"payload":1,"request":[]}`:                        `"request" must be an object`,
		`{"payload":1,"request":{"headers":{"A":1}}}`:       `"request.headers" must be a string`,
		`{"payload":1,"request":{"query":{"a":{"b":"c"}}}}`: `query "a" must be a string or an array of strings`,
	} {
		st, _, got := do(t, h, "POST", "/v1/tenants/acme/jobs", body)
		if msg, _ := got["message"].(string); st != 400 || !strings.Contains(msg, want) {
			t.Errorf("%s: %d %v, want 400 saying %s", body, st, got, want)
		}
	}
}

// GET /v1/jobs/{id} shows the downstream's answer field by field, as the
// document describes it: text, or base64 for bytes that are not UTF-8, and
// the document refuses an answer that changes that shape.
func TestJobShowsTheResponse(t *testing.T) {
	t.Parallel()
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	schema := doc.Components.Schemas["Job"].Value
	job := func(r *queue.Response) map[string]any {
		j := queue.Job{ID: "01J", Tenant: "acme", State: queue.StateFailed, Attempts: 1, ResponseStatus: r.Status,
			Request: &queue.JobRequest{Path: "/v1/refunds"}, Response: r}
		var m map[string]any
		raw, _ := json.Marshal(jobJSON(j))
		_ = json.Unmarshal(raw, &m)
		return m
	}
	text := job(&queue.Response{Status: 402, Headers: map[string]string{"Content-Type": "application/json", "Request-Id": "req_1"},
		Body: `{"error":{"code":"card_declined"}}`})
	bin := job(&queue.Response{Status: 200, BodyBase64: "/w==", Truncated: true})
	for name, m := range map[string]map[string]any{"text": text, "bytes": bin} {
		if err := schema.VisitJSON(m, openapi3.EnableJSONSchema2020()); err != nil {
			t.Errorf("%s: not as documented: %v", name, err)
		}
	}
	if got, _ := json.Marshal(text["response"]); string(got) != `{"body":"{\"error\":{\"code\":\"card_declined\"}}","headers":{"Content-Type":"application/json","Request-Id":"req_1"},"status":402,"truncated":false}` {
		t.Errorf("text response: %s", got)
	}
	if got, _ := json.Marshal(bin["response"]); string(got) != `{"body_base64":"/w==","headers":{},"status":200,"truncated":true}` {
		t.Errorf("bytes response: %s", got)
	}
	changed := map[string]func(r map[string]any){
		"both bodies":      func(r map[string]any) { r["body"] = "x" },
		"no truncated":     func(r map[string]any) { delete(r, "truncated") },
		"a field added":    func(r map[string]any) { r["authorization"] = "Bearer x" },
		"a header as list": func(r map[string]any) { r["headers"] = map[string]any{"A": []any{"b"}} },
	}
	for name, change := range changed {
		m := job(&queue.Response{Status: 200, BodyBase64: "/w=="})
		change(m["response"].(map[string]any))
		if err := schema.VisitJSON(m, openapi3.EnableJSONSchema2020()); err == nil {
			t.Errorf("%s: the document took it", name)
		}
	}
}
