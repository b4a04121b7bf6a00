package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/rules"
)

// A held tenant's queue frees nothing until an operator resumes it: its
// 429 asks for no retry sooner than rules.HeldRetryAfter, in the body, the
// Retry-After header and the RateLimit field alike, where the answer as
// if resumed now would have said 0 and "Retry-After: 1".
func TestHeldTenantsRefusalDoesNotInviteASpin(t *testing.T) {
	t.Parallel()
	h, _ := newAPIConfig(t, "[tenant_defaults]\nrate = \"100/s\"\ncapacity = 2\n", nil)
	if st, _, body := do(t, h, "POST", "/v1/tenants/acme/pause", ""); st != http.StatusOK || body["held"] != true {
		t.Fatalf("pause: %d %v", st, body)
	}
	for i := range 2 {
		if st, _, body := do(t, h, "POST", "/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload": %d}`, i)); st != http.StatusAccepted {
			t.Fatalf("job %d while held: %d %v", i, st, body)
		}
	}
	st, hdr, body := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 2}`)
	secs := int64(rules.HeldRetryAfter.Seconds())
	if st != http.StatusTooManyRequests || body["error"] != "queue_full" || body["retry_after_ms"] != float64(rules.HeldRetryAfter.Milliseconds()) ||
		hdr.Get("Retry-After") != fmt.Sprint(secs) || !strings.Contains(hdr.Get("RateLimit"), fmt.Sprintf("r=0;t=%d", secs)) {
		t.Fatalf("a full held queue: %d Retry-After %q RateLimit %q %v, want 429 queue_full, retry after %v", st, hdr.Get("Retry-After"), hdr.Get("RateLimit"), body, rules.HeldRetryAfter)
	}
	// Resumed, the same queue says when room comes, as ever.
	if st, _, body := do(t, h, "POST", "/v1/tenants/acme/resume", ""); st != http.StatusOK {
		t.Fatalf("resume: %d %v", st, body)
	}
	st, hdr, body = do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload": 3}`)
	if st == http.StatusTooManyRequests && body["retry_after_ms"].(float64) >= float64(rules.HeldRetryAfter.Milliseconds()) {
		t.Fatalf("after the resume: %d Retry-After %q %v, want the queue's own wait", st, hdr.Get("Retry-After"), body)
	}
}

// Pause and resume take no body, or {}, as the document says: anything
// else is refused, 400 (413 past a few bytes), and the hold does not
// change; a body is never read past its bound.
func TestHoldTakesNoBodyOrAnEmptyObject(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	for _, body := range []string{"", "{}", " { } \n"} {
		if st, _, ans := do(t, h, "POST", "/v1/tenants/acme/pause", body); st != http.StatusOK || ans["held"] != true {
			t.Fatalf("pause with %q: %d %v", body, st, ans)
		}
		if st, _, ans := do(t, h, "POST", "/v1/tenants/acme/resume", body); st != http.StatusOK || ans["held"] != false {
			t.Fatalf("resume with %q: %d %v", body, st, ans)
		}
	}
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{"not json", 400, "invalid_json"},
		{"[]", 400, "invalid_json"},
		{"null", 400, "invalid_json"},
		{`{"until": "5m"}`, 400, "unknown_field"},
		{"{}{}", 400, "invalid_json"},
		// {} and then a closing bracket: not JSON, though a streaming
		// decoder stops before the bracket (and dec.More says no more).
		{"{}}", 400, "invalid_json"},
		{"{} ]", 400, "invalid_json"},
		// Whitespace alone is not "no body", and not JSON.
		{"  ", 400, "invalid_json"},
		{"\n", 400, "invalid_json"},
		{`"` + strings.Repeat("x", 1<<20) + `"`, 413, "body_too_large"},
	} {
		for _, verb := range []string{"pause", "resume"} {
			st, _, ans := do(t, h, "POST", "/v1/tenants/acme/"+verb, c.body)
			if st != c.status || ans["error"] != c.code {
				t.Errorf("%s with %.20q: %d %v, want %d %s", verb, c.body, st, ans, c.status, c.code)
			}
		}
	}
	if _, _, ten := do(t, h, "GET", "/v1/tenants/acme", ""); ten["held"] != false {
		t.Fatalf("a refused pause held the tenant: %v", ten)
	}
}
