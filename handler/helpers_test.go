package handler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// writeConfig writes a config for an embedded store in the test's
// directory, the API on a free loopback port, and body after it.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	full := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n[store]\npath = %q\n%s",
		filepath.Join(dir, "throttler.db"), body)
	if err := os.WriteFile(p, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs the service with mux on the config file until the test ends,
// and returns the API's base URL.
func start(t *testing.T, file string, mux *handler.Mux) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	go func() {
		done <- handler.Run(ctx, handler.Options{ConfigFile: file, Handlers: mux, Logger: log, Started: func(a string) { addr <- a }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("handler.Run: %v", err)
		}
		if t.Failed() {
			logMu.Lock()
			t.Logf("service log:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("handler.Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the service did not start within 10s")
	}
	return ""
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// call sends a JSON request and decodes the answer.
func call(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, out
}

// enqueueBatch enqueues jobs (JSON objects) for tenant and returns their
// ids in order.
func enqueueBatch(t *testing.T, base, tenant string, jobs []string) []string {
	t.Helper()
	var ids []string
	for len(jobs) > 0 {
		n := min(len(jobs), 1000)
		body := `{"jobs": [` + join(jobs[:n]) + `]}`
		jobs = jobs[n:]
		status, out := call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs:batch", body)
		results, _ := out["results"].([]any)
		if status != http.StatusOK || len(results) != n {
			t.Fatalf("batch: %d %v", status, out)
		}
		for _, r := range results {
			m := r.(map[string]any)
			if m["status"].(float64) != http.StatusAccepted {
				t.Fatalf("a job was refused: %v", m)
			}
			ids = append(ids, m["id"].(string))
		}
	}
	return ids
}

func join(items []string) string {
	var b bytes.Buffer
	for i, s := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s)
	}
	return b.String()
}

// state is a job's state as GET /v1/jobs/{id} shows it.
func state(t *testing.T, base, id string) (string, map[string]any) {
	t.Helper()
	_, j := call(t, "GET", base+"/v1/jobs/"+id, "")
	s, _ := j["state"].(string)
	return s, j
}

// waitStates waits until every job is in a final state and returns each
// one's.
func waitStates(t *testing.T, base string, ids []string, within time.Duration) map[string]string {
	t.Helper()
	got := map[string]string{}
	testutil.WaitFor(t, within, "every job finished", func() bool {
		for _, id := range ids {
			if s := got[id]; s == "succeeded" || s == "failed" || s == "cancelled" || s == "expired" {
				continue
			}
			s, _ := state(t, base, id)
			got[id] = s
			if s != "succeeded" && s != "failed" && s != "cancelled" && s != "expired" {
				return false
			}
		}
		return true
	})
	return got
}
