package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// The ceiling answers what the enqueue route answers: 202 with the same
// body fields and RateLimit headers, 400 for what the API refuses as JSON.
func TestCeilingServesTheEnqueueShape(t *testing.T) {
	t.Parallel()
	h := ceilingHandler()
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/tenants/acme/jobs", strings.NewReader(body)))
		return w
	}
	w := post(`{"payload":{"text":"hi"},"idempotency_key":"k","cost":1}`)
	if w.Code != http.StatusAccepted || w.Header().Get("RateLimit") == "" || w.Header().Get("RateLimit-Policy") == "" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"capacity", "dispatch_at", "expected_delay_ms", "id", "queue_depth", "state", "tenant"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) || got["tenant"] != "acme" || got["state"] != "queued" {
		t.Fatalf("answer %v, want the fields %v", got, want)
	}
	for _, bad := range []string{``, `{`, `{"payload":1,"x":2}`, `{"payload":1} {}`, `{}`} {
		if w := post(bad); w.Code != http.StatusBadRequest {
			t.Errorf("%q: %d, want 400", bad, w.Code)
		}
	}
}
