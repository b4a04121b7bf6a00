package api

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

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
