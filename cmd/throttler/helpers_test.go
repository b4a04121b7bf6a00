package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"throttler/internal/downstreamtest"
	"throttler/internal/servicetest"
	"throttler/internal/testutil"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, what, cond)
}

func writeConfig(t testing.TB, body string, ds *downstreamtest.Server) string {
	t.Helper()
	return servicetest.WriteConfig(t, body, ds.URL+"/send")
}

func startServer(t testing.TB, file string) string {
	t.Helper()
	return servicetest.Start(t, file)
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: 30 * time.Second}

// send sends a request and returns the answer's status, header and body.
func send(t *testing.T, method, url string, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw
}

// call sends a request and decodes the JSON answer.
func call(t *testing.T, method, url string, body string, header ...string) (int, http.Header, map[string]any) {
	t.Helper()
	status, h, raw := send(t, method, url, body, header...)
	var m map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %q", method, url, raw)
		}
	}
	return status, h, m
}

// callRaw sends a request and returns the answer's status and body as text.
func callRaw(t *testing.T, method, url, body string, header ...string) (int, string) {
	t.Helper()
	status, _, raw := send(t, method, url, body, header...)
	return status, string(raw)
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
