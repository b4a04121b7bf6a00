// Package servicetest runs a whole throttler in-process for tests: real
// store file, real HTTP listener on a free loopback port, real dispatcher.
package servicetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/service"
)

// WriteConfig writes a config file for a test: a listener on a free port, a
// store in the test's directory, one downstream "test" at downstreamURL, and
// body after that.
func WriteConfig(t testing.TB, body, downstreamURL string) string {
	t.Helper()
	return WriteConfigServer(t, "", body, downstreamURL)
}

// WriteConfigServer is WriteConfig with more keys for [server].
func WriteConfigServer(t testing.TB, server, body, downstreamURL string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	full := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n%s\n[store]\npath = %q\n[downstreams.test]\nurl = %q\ntimeout = \"2s\"\n%s",
		server, filepath.Join(t.TempDir(), "throttler.db"), downstreamURL, body)
	if err := os.WriteFile(p, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Start runs the service on the config file and returns the API's base URL.
// It stops when the test ends (and shows its log if the test failed).
func Start(t testing.TB, file string) string {
	t.Helper()
	base, _ := StartStoppable(t, file)
	return base
}

// StartStoppable is Start, with a stop that ends the service before the
// test does (and waits until it has stopped); safe to call more than once.
func StartStoppable(t testing.TB, file string) (base string, stop func()) {
	t.Helper()
	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	var runErr error
	finished := make(chan struct{}) // closed once Run has returned runErr
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	go func() {
		runErr = service.Run(ctx, service.Options{Config: cfg, Logger: log, Started: func(a string) { addr <- a }})
		close(finished)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-finished
			if runErr != nil {
				t.Errorf("service: %v", runErr)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			logMu.Lock()
			t.Logf("service log:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	select {
	case a := <-addr:
		return "http://" + a, stop
	case <-finished:
		t.Fatalf("service: %v", runErr)
	case <-time.After(10 * time.Second):
		t.Fatal("service did not start")
	}
	return "", stop
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Serve runs the service like Start, for code that has no testing.TB (a
// TestMain that starts a server for runnable examples): its config (a
// listener on a free port, a store under dir, one downstream "test" at
// downstreamURL, then body) and its store live under dir. It returns the
// API's base URL and a stop function that ends the service and says how it
// ended; the service's log is discarded.
func Serve(dir, body, downstreamURL string) (url string, stop func() error, err error) {
	file := filepath.Join(dir, "config.toml")
	full := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n[store]\npath = %q\n[downstreams.test]\nurl = %q\ntimeout = \"2s\"\n%s",
		filepath.Join(dir, "throttler.db"), downstreamURL, body)
	if err := os.WriteFile(file, []byte(full), 0o600); err != nil {
		return "", nil, err
	}
	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- service.Run(ctx, service.Options{Config: cfg, Logger: log, Started: func(a string) { addr <- a }})
	}()
	stop = func() error { cancel(); return <-done }
	select {
	case a := <-addr:
		return "http://" + a, stop, nil
	case err := <-done:
		cancel()
		return "", nil, fmt.Errorf("service: %w", err)
	case <-time.After(10 * time.Second):
		stop()
		return "", nil, fmt.Errorf("service did not start within 10s")
	}
}
