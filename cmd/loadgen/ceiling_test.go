package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
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

// --beside loads two servers at once and prints, per round, both rates and
// the second's as a ratio of the first's.
func TestAdmitBesideLoadsBothAtOnce(t *testing.T) {
	t.Parallel()
	a, b := httptest.NewServer(ceilingHandler()), httptest.NewServer(ceilingHandler())
	defer a.Close()
	defer b.Close()
	var out strings.Builder
	start := time.Now()
	admitBeside(&out, newClient(4), newClient(4), a.URL, b.URL, 4, 10, 2, 200*time.Millisecond)
	// Each run lasts its duration: one after the other, two rounds would
	// take 800 ms.
	if took := time.Since(start); took >= 700*time.Millisecond {
		t.Fatalf("two rounds took %v: the two loads did not run at once", took)
	}
	text := out.String()
	for _, want := range []string{"round 1 server: requests ", "round 1 beside: requests ", "round 2 server: ", "round 2 beside: "} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "202: 0,") {
		t.Fatalf("a server got no admissions:\n%s", text)
	}
	last := text[strings.LastIndex(text, "beside / server by round: "):]
	if ratios := strings.Split(strings.TrimSpace(strings.TrimPrefix(last, "beside / server by round: ")), " / "); len(ratios) != 2 {
		t.Fatalf("want two ratios, got %q", last)
	}
}
