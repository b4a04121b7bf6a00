package api

import (
	"net/http"
	"strings"
	"testing"
)

// A body that is not UTF-8 is refused at admission, 400 invalid_utf8,
// naming where: the payload would go on as application/json, which RFC
// 8259 says is UTF-8, and the vendor would refuse it or mangle it. Nothing
// is queued, on the single and the batch endpoint alike.
func TestInvalidUTF8IsRefused(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	for _, c := range []struct{ path, body string }{
		{"/v1/tenants/acme/jobs", "{\"payload\": \"caf\xe9\"}"},
		{"/v1/tenants/acme/jobs", "{\"payload\": {\"to\": \"+1\", \"text\": \"\xff\xfe\"}}"},
		{"/v1/tenants/acme/jobs", "{\"payload\": 1, \"callback_url\": \"https://x/\xc3\"}"},
		{"/v1/tenants/acme/jobs:batch", "{\"jobs\": [{\"payload\": 1}, {\"payload\": \"\xed\xa0\x80\"}]}"},
	} {
		status, _, body := do(t, h, "POST", c.path, c.body)
		msg, _ := body["message"].(string)
		if status != http.StatusBadRequest || body["error"] != "invalid_utf8" || !strings.Contains(msg, "UTF-8") || !strings.Contains(msg, "byte") {
			t.Errorf("POST %s %q: %d %v, want 400 invalid_utf8 saying where", c.path, c.body, status, body)
		}
	}
	if got := depth(t, h, "acme"); got != "depth 0 accepted 0" {
		t.Fatalf("after the refusals: %s, want nothing queued", got)
	}
	// UTF-8 and escapes of any character are taken as they are.
	status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": "café \u00e9 \ud83d\ude00 😀"}`)
	if status != http.StatusAccepted {
		t.Fatalf("a UTF-8 payload: %d %v", status, body)
	}
}

// null is none of the values the document gives an optional field (its
// types forbid it): it is refused, 400 naming the field, rather than read
// as absent; payload alone takes null (a GET or DELETE sends no body).
// The same in a batch, naming the job.
func TestNullOptionalFieldsAreRefused(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	for _, field := range []string{"cost", "deadline", "expires_in", "idempotency_key", "type", "request", "callback_on", "callback_url"} {
		status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "`+field+`": null}`)
		msg, _ := body["message"].(string)
		if status != http.StatusBadRequest || body["error"] != "invalid_json" || !strings.Contains(msg, `"`+field+`"`) || !strings.Contains(msg, "null") {
			t.Errorf("%s null: %d %v, want 400 invalid_json naming it", field, status, body)
		}
	}
	// So is "" for a string that cannot be empty (a type can: none).
	for _, field := range []string{"idempotency_key", "deadline", "expires_in", "callback_url"} {
		status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "`+field+`": ""}`)
		if msg, _ := body["message"].(string); status != http.StatusBadRequest || body["error"] != "invalid_json" || !strings.Contains(msg, `"`+field+`" is empty`) {
			t.Errorf("%s empty: %d %v, want 400 invalid_json naming it", field, status, body)
		}
	}
	// And an Idempotency-Key header given empty: as "" in the body, not
	// read as no key (a client's retry would be taken twice).
	hdr := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {""}}
	if status, _, body := doHeader(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1}`, hdr); status != http.StatusBadRequest || body["error"] != "invalid_idempotency_key" {
		t.Errorf("an empty Idempotency-Key header: %d %v, want 400 invalid_idempotency_key", status, body)
	}
	// The same inside "request": null for a part, a header's value or an
	// item of a query parameter's array, and "" for its path (which the
	// document wants absolute).
	for _, c := range []struct{ request, says string }{
		{`{"method": null}`, `"request.method" is null`},
		{`{"path": null}`, `"request.path" is null`},
		{`{"query": null}`, `"request.query" is null`},
		{`{"headers": null}`, `"request.headers" is null`},
		{`{"headers": {"X-Ref": null}}`, `"request.headers.X-Ref" is null`},
		{`{"query": {"id": ["a", null]}}`, `"request.query.id" is null`},
		{`{"path": ""}`, `"request.path" is empty`},
	} {
		status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "request": `+c.request+`}`)
		if msg, _ := body["message"].(string); status != http.StatusBadRequest || body["error"] != "invalid_json" || !strings.Contains(msg, c.says) {
			t.Errorf("request %s: %d %v, want 400 invalid_json saying %s", c.request, status, body, c.says)
		}
	}
	status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs": [{"payload": 1}, {"payload": 2, "cost": null}]}`)
	if msg, _ := body["message"].(string); status != http.StatusBadRequest || body["error"] != "invalid_json" || !strings.Contains(msg, "jobs[1]") || !strings.Contains(msg, `"cost"`) {
		t.Errorf("batch with a null cost: %d %v, want 400 invalid_json naming jobs[1] and cost", status, body)
	}
	if got := depth(t, h, "acme"); got != "depth 0 accepted 0" {
		t.Fatalf("after the refusals: %s, want nothing queued", got)
	}
	// Null inside the payload, or as a query value (documented as absent),
	// is the producer's business.
	status, _, body = do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": {"a": null, "cost": null}, "request": {"query": {"x": null}}}`)
	if status != http.StatusAccepted {
		t.Fatalf("nulls in the payload and the query: %d %v", status, body)
	}
}

// An integer query parameter given empty (?limit=) is refused, 400
// invalid_parameter, not read as its default: the client meant something.
func TestEmptyIntegerParametersAreRefused(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	for _, path := range []string{"/v1/tenants?limit=", "/v1/tenants?offset=", "/v1/tenants?limit=10&offset=", "/v1/tenants/acme/jobs?state=failed&limit="} {
		status, _, body := do(t, h, "GET", path, "")
		if msg, _ := body["message"].(string); status != http.StatusBadRequest || body["error"] != "invalid_parameter" || !strings.Contains(msg, "empty") {
			t.Errorf("GET %s: %d %v, want 400 invalid_parameter saying it is empty", path, status, body)
		}
	}
	for _, path := range []string{"/v1/tenants", "/v1/tenants?limit=5", "/v1/tenants/acme/jobs?state=failed"} {
		if status, _, body := do(t, h, "GET", path, ""); status != http.StatusOK {
			t.Errorf("GET %s: %d %v", path, status, body)
		}
	}
}
