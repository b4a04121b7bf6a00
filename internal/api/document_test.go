package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
)

// Tests that the document tells what the server does where no answer of
// the other tests would show it wrong: codes no test provokes, values the
// schema lets through that the server refuses, rules only prose can say,
// and answers no operation lists.

// errorCodeRE finds the error answers the package's code writes: the
// status and the code.
var errorCodeRE = regexp.MustCompile(`http\.Status(\w+), "([a-z0-9_]+)"|Code: +"([a-z0-9_]+)"`)

// Every error code the server's code can answer is in the document under
// its status: a code a test never provokes is checked here, read from the
// source.
func TestDocumentListsEveryErrorCode(t *testing.T) {
	t.Parallel()
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("*.go")
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range errorCodeRE.FindAllStringSubmatch(string(src), -1) {
			status, code := statusOf(m[1]), m[2]
			if m[3] != "" { // a NotAllowedError's code: a 422
				status, code = http.StatusUnprocessableEntity, m[3]
			}
			if status == 0 {
				t.Errorf("%s: http.Status%s: no status known to this test", f, m[1])
				continue
			}
			if codes := documentedCodes(doc, status); !slices.Contains(codes, code) {
				t.Errorf("%s answers %d %s; the document's %d answers list %v", f, status, code, status, codes)
			}
			seen++
		}
	}
	if seen < 30 {
		t.Fatalf("only %d error answers found in the source", seen)
	}
}

// statusOf is the status of net/http's constant name ("BadRequest": 400).
func statusOf(name string) int {
	for s := 100; s < 600; s++ {
		if strings.ReplaceAll(http.StatusText(s), " ", "") == name || (s == 413 && name == "RequestEntityTooLarge") {
			return s
		}
	}
	return 0
}

// documentedCodes are the error codes the document gives status, across
// its operations (and, for 405, which no operation lists, its
// MethodNotAllowed answer).
func documentedCodes(doc *openapi3.T, status int) []string {
	var codes []string
	add := func(r *openapi3.ResponseRef) {
		if r == nil || r.Value == nil {
			return
		}
		if mt := r.Value.Content.Get("application/json"); mt != nil {
			codes = append(codes, schemaCodes(mt.Schema, 0)...)
		}
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			add(op.Responses.Value(strconv.Itoa(status)))
		}
	}
	if status == http.StatusMethodNotAllowed {
		add(doc.Components.Responses["MethodNotAllowed"])
	}
	slices.Sort(codes)
	return slices.Compact(codes)
}

// schemaCodes are the values a schema's "error" property may take.
func schemaCodes(s *openapi3.SchemaRef, depth int) []string {
	if s == nil || s.Value == nil || depth > 8 {
		return nil
	}
	var out []string
	for _, sub := range slices.Concat(s.Value.OneOf, s.Value.AnyOf, s.Value.AllOf) {
		out = append(out, schemaCodes(sub, depth+1)...)
	}
	if e := s.Value.Properties["error"]; e != nil && e.Value != nil {
		for _, v := range e.Value.Enum {
			out = append(out, fmt.Sprint(v))
		}
		if e.Value.Const != nil {
			out = append(out, fmt.Sprint(e.Value.Const))
		}
	}
	return out
}

// A wait the server cannot take is 400 invalid_wait, as the document says
// (a code of its BadRequest answer).
func TestInvalidWaitIsDocumented(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	_, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1}`)
	for _, wait := range []string{"2m", "61", "61s", "x", "-1s", ""} {
		status, _, ans := do(t, h, "GET", "/v1/jobs/"+body["id"].(string)+"?wait="+wait, "")
		if status != http.StatusBadRequest || ans["error"] != "invalid_wait" {
			t.Errorf("wait=%s: %d %v, want 400 invalid_wait", wait, status, ans)
		}
	}
}

// requestMalformed is the document's verdict on a request: nil when it
// takes it, else why not.
func requestMalformed(method, path, body string) error {
	router, err := apiRouter()
	if err != nil {
		return err
	}
	req := httptestRequest(method, path, body)
	route, params, err := router.FindRoute(req)
	if err != nil {
		return err
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: filterOptions}
	return openapi3filter.ValidateRequest(context.Background(), in)
}

func httptestRequest(method, path, body string) *http.Request {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// The schema of a job's type, expires_in and of ?wait refuses what the
// server refuses (printable ASCII for a type; Go's duration syntax, and
// whole seconds for a wait) and takes what it takes; what a pattern cannot
// bound (the maxima) its description says, and the server refuses past it.
func TestDocumentPatternsMatchTheServer(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	_, _, first := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1}`)
	jobPath := "/v1/jobs/" + first["id"].(string)
	do(t, h, "DELETE", jobPath, "") // ended: a wait is answered at once
	type value struct {
		v      string
		server bool // the server takes it
	}
	check := func(what string, vals []value, request func(v string) (method, path, body string)) {
		for _, c := range vals {
			method, path, body := request(c.v)
			status, _, ans := do(t, h, method, path, body)
			if took := status < 400 || status == http.StatusUnprocessableEntity; took != c.server {
				t.Errorf("%s %q: the server answered %d %v, want taken %v", what, c.v, status, ans, c.server)
			}
			if err := requestMalformed(method, path, body); (err == nil) != c.server {
				t.Errorf("%s %q: the document's verdict %v, want taken %v as the server", what, c.v, err, c.server)
			}
		}
	}
	jsonString := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	check("type", []value{{"email:welcome", true}, {" ~!", true}, {"", true}, {"é", false}, {"a\x01", false}, {"a\x7f", false}},
		func(v string) (string, string, string) {
			return "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "type": ` + jsonString(v) + `}`
		})
	check("expires_in", []value{{"30s", true}, {"0", true}, {"-5s", true}, {"+30s", true}, {"1h30m", true}, {"1.5h", true}, {".5s", true}, {"5.s", true},
		{"5µs", true}, {"5μs", true}, {"8784h", true}, {"-m", false}, {".h", false}, {"h", false}, {"1d", false}, {"5", false}, {"30 s", false}, {"", false}},
		func(v string) (string, string, string) {
			return "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "expires_in": ` + jsonString(v) + `}`
		})
	check("wait", []value{{"30", true}, {"0", true}, {"060", true}, {"500ms", true}, {"1m", true}, {"0.5m", true}, {"-0s", true}, {"+5s", true},
		{"1.5s", true}, {".5s", true}, {"60s", true}, {"+0", true}, {"-m", false}, {".h", false}, {"1d", false}, {"-5s", false}, {"-0s5ms", false}, {"+", false}, {"5 s", false}},
		func(v string) (string, string, string) { return "GET", jobPath + "?wait=" + url.QueryEscape(v), "" })
	// Past the maxima: refused by the server, said by the description.
	doc, _ := apiDoc()
	wait := doc.Paths.Find("/v1/jobs/{id}").Get.Parameters.GetByInAndName("query", "wait")
	expires := doc.Components.Schemas["JobRequest"].Value.Properties["expires_in"].Value
	for _, c := range []struct{ desc, says string }{{wait.Description, "400 invalid_wait"}, {expires.Description, "400 invalid_deadline"}, {expires.Description, "8784h"}} {
		if !strings.Contains(c.desc, c.says) {
			t.Errorf("the description %q does not say %q", c.desc, c.says)
		}
	}
	if status, _, ans := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 1, "expires_in": "8785h"}`); status != http.StatusBadRequest || ans["error"] != "invalid_deadline" {
		t.Errorf("expires_in past 366 days: %d %v, want 400 invalid_deadline", status, ans)
	}
}

// The rules the schema cannot express are in the document's prose, each
// where a reader of that part looks, naming the code the server answers;
// and the server answers it.
func TestDocumentSaysTheRulesItsSchemaCannot(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	var raw any
	if err := json.Unmarshal(openAPI, &raw); err != nil {
		t.Fatal(err)
	}
	const enqueue = "/paths/~1v1~1tenants~1{tenant}~1jobs/post"
	for _, r := range []struct {
		rule, body, header string
		code, where        string
	}{
		{"a payload, unless the job's request is a GET or DELETE", `{}`, "", "missing_payload", "/components/schemas/JobRequest/properties/payload/description"},
		{"callback_on needs a callback_url, the job's or its tenant's", `{"payload": 1, "callback_on": ["failed"]}`, "", "invalid_callback_on", "/components/schemas/JobRequest/properties/callback_on/description"},
		{"the Idempotency-Key header and the body's key agree", `{"payload": 1, "idempotency_key": "a"}`, "b", "invalid_idempotency_key", enqueue + "/parameters/0/description"},
		{"an optional field is never null", `{"payload": 1, "cost": null}`, "", "invalid_json", "/components/schemas/JobRequest/description"},
		{"expires_in is at most 366 days", `{"payload": 1, "expires_in": "9000h"}`, "", "invalid_deadline", "/components/schemas/JobRequest/properties/expires_in/description"},
	} {
		hdr := http.Header{"Content-Type": {"application/json"}}
		if r.header != "" {
			hdr.Set("Idempotency-Key", r.header)
		}
		status, _, body := doHeader(t, h, "POST", "/v1/tenants/acme/jobs", r.body, hdr)
		if status != http.StatusBadRequest || body["error"] != r.code {
			t.Errorf("%s: the server answered %d %v, want 400 %s", r.rule, status, body, r.code)
		}
		if text, _ := pointer(raw, r.where).(string); !strings.Contains(text, r.code) {
			t.Errorf("%s: the document at %s says %q, not naming %s", r.rule, r.where, text, r.code)
		}
	}
	// A batch with one malformed job queues nothing.
	status, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs:batch", `{"jobs": [{"payload": 1}, {}]}`)
	batch, _ := pointer(raw, "/paths/~1v1~1tenants~1{tenant}~1jobs:batch/post/description").(string)
	if status != http.StatusBadRequest || !strings.Contains(batch, "refused whole") || depth(t, h, "acme") != "depth 0 accepted 0" {
		t.Errorf("a batch with a malformed job: %d %v; the document says %q", status, body, batch)
	}
}

// pointer is the value at a JSON pointer (RFC 6901) of v, nil if none.
func pointer(v any, p string) any {
	for _, tok := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch c := v.(type) {
		case map[string]any:
			v = c[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			v = c[i]
		default:
			return nil
		}
	}
	return v
}

// The answers no operation lists are in the document too: 405 with Allow
// for a method a known path does not take (its MethodNotAllowed answer,
// which every 405 of the tests is checked against), the router's 307 to a
// path's clean form, and the HTTP server's own text answers to a request
// it cannot read (400, 431: see TestAnswersBeforeAnyRoute in
// cmd/throttler, which sends them to the real server).
func TestDocumentTellsTheAnswersNoOperationLists(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	doc, _ := apiDoc()
	status, hdr, body := do(t, h, "PATCH", "/v1/tenants", "")
	if status != http.StatusMethodNotAllowed || hdr.Get("Allow") != "GET, HEAD" || body["error"] != "method_not_allowed" {
		t.Errorf("PATCH /v1/tenants: %d Allow %q %v", status, hdr.Get("Allow"), body)
	}
	status, hdr, _ = do(t, h, "GET", "/v1/jobs/../tenants", "")
	if status != http.StatusTemporaryRedirect || hdr.Get("Location") != "/v1/tenants" {
		t.Errorf("GET /v1/jobs/../tenants: %d Location %q, want 307 to /v1/tenants", status, hdr.Get("Location"))
	}
	for _, says := range []string{"405", "Allow", "307", "Location", "400", "431", "text/plain", "invalid_tenant"} {
		if !strings.Contains(doc.Info.Description, says) {
			t.Errorf("the document's description does not say %q", says)
		}
	}
	for name, status := range map[string]string{"MethodNotAllowed": "405", "Redirect": "307", "MalformedRequest": "400", "HeaderFieldsTooLarge": "431"} {
		r := doc.Components.Responses[name]
		if r == nil || r.Value == nil || r.Value.Description == nil || !strings.Contains(*r.Value.Description, status) {
			t.Errorf("the document has no %s answer (%s)", name, status)
		}
	}
}
