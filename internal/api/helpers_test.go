package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/config"
	"throttler/internal/leaky"
	"throttler/internal/queue/bolt"
)

func timeMS(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

func urlPathEscape(s string) string { return url.PathEscape(s) }

// newAPIForFuzz is newAPI for a fuzz target (one store for all inputs).
func newAPIForFuzz(f *testing.F) (http.Handler, *bolt.Store) {
	cfg, err := config.Load("", nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "throttler-fuzz-")
	if err != nil {
		f.Fatal(err)
	}
	store, err := bolt.Open(filepath.Join(dir, "t.db"), bolt.Options{Policy: func(string) leaky.Policy { return cfg.TenantDefaults.Policy() }})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close(); os.RemoveAll(dir) })
	return New(Options{Store: store, Config: func() *config.Config { return cfg }}), store
}

// newAPIConfig is an API on its own store with the config body (TOML over
// the defaults) and a clock that both read.
func newAPIConfig(t *testing.T, body string, clk clock.Clock) (http.Handler, *bolt.Store) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := func(name string) leaky.Policy { ts, _ := cfg.Tenant(name); return ts.Policy() }
	store, err := bolt.Open(filepath.Join(t.TempDir(), "t.db"), bolt.Options{Policy: policy, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return New(Options{Store: store, Config: func() *config.Config { return cfg }, Clock: clk}), store
}

// do sends one request to h and returns the status, headers and the
// decoded JSON body.
func do(t testing.TB, h http.Handler, method, path, body string) (int, http.Header, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	var m map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	return rec.Code, rec.Header(), m
}
