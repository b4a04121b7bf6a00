package api

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/metrics"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

// The status page's reads: who the caller is, the downstreams, and the
// samples the server keeps of the busiest tenants.
func TestStatusPageReads(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, "")
	store := openStore(t, t.TempDir(), cfg, bolt.Options{})
	ctx := context.Background()
	if _, err := store.Enqueue(ctx, "acme", []queue.NewJob{{Payload: []byte("1")}, {Payload: []byte("2")}, {Payload: []byte("3")}}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(store, func(string) (string, string) { return "default", metrics.OtherTenants }, func() []string { return nil })
	rc := m.KeepRecent(ctx, metrics.RecentOptions{Every: time.Hour}) // the one sample taken at start
	t.Cleanup(rc.Stop)
	h := New(Options{Store: store, Config: func() *config.Config { return cfg }, Metrics: m})

	if st, _, w := do(t, h, "GET", "/v1/whoami", ""); st != 200 || w["auth"] != false || w["can_hold"] != true || w["all_tenants"] != true {
		t.Fatalf("whoami with no auth: %d %v", st, w)
	}
	st, _, body := do(t, h, "GET", "/v1/history?tenant=acme&tenant=quiet", "")
	tenants, _ := body["tenants"].(map[string]any)
	acme, _ := tenants["acme"].(map[string]any)
	if st != 200 || acme == nil || tenants["quiet"] != nil || body["interval_ms"] != float64(3600000) || body["now_ms"] == nil {
		t.Fatalf("history: %d %v", st, body)
	}
	if d := acme["depth"].([]any); len(d) != 1 || d[0] != float64(3) || len(acme["t"].([]any)) != 1 {
		t.Fatalf("acme's samples: %v", acme)
	}
	st, _, body = do(t, h, "GET", "/v1/downstreams", "")
	items, _ := body["downstreams"].([]any)
	if st != 200 || len(items) != 1 {
		t.Fatalf("downstreams: %d %v", st, body)
	}
	if d := items[0].(map[string]any); d["name"] != "default" || d["ceiling"] != nil || d["breaker_open"] != false || d["history"] == nil {
		t.Fatalf("the default downstream: %v", d)
	}

	many := url.Values{}
	for i := 0; i <= maxHistoryTenants; i++ {
		many.Add("tenant", "t"+strings.Repeat("x", i%5))
	}
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/v1/history?tenant=" + url.QueryEscape("not a name"), 400},
		{"GET", "/v1/history?" + many.Encode(), 400},
		{"POST", "/v1/whoami", 405},
		{"DELETE", "/v1/history", 405},
	} {
		if st, _, b := do(t, h, c.method, c.path, ""); st != c.status {
			t.Errorf("%s %s: %d %v, want %d", c.method, c.path, st, b, c.status)
		}
	}

	// Without metrics (no sampler): empty, not an error.
	bare, _ := newAPI(t)
	if st, _, body := do(t, bare, "GET", "/v1/history?tenant=acme", ""); st != 200 || len(body["tenants"].(map[string]any)) != 0 || body["interval_ms"] != float64(0) {
		t.Fatalf("history with no sampler: %d %v", st, body)
	}
}

// The page is the same static bytes for everyone, and its script is the
// page's scripts, in order, as one.
func TestStatusPageAssets(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	st, hdr, _ := do(t, h, "GET", "/", "")
	if st != 200 || !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("page: %d %v", st, hdr)
	}
	js := string(serve(h, "GET", "/static/app.js"))
	last := -1
	for _, name := range pageScripts {
		raw, _ := pageFS.ReadFile(name)
		i := strings.Index(js, string(raw))
		if i < 0 || i < last {
			t.Fatalf("%s is not in /static/app.js, in order", name)
		}
		last = i
	}
}
