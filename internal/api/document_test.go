package api

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
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
