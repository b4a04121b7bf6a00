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
