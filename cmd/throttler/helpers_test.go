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
)

// nothingMoreWithin lets d pass so that the checks after it can show that
// nothing more happened meanwhile: no repeat, no late send, no job that
// should not go. Absence has no condition to wait for, so this is the one
// kind of fixed sleep the tests keep; everything that waits for something
// to happen waits for it with testutil.WaitFor.
func nothingMoreWithin(d time.Duration) { time.Sleep(d) }

// arriveAt waits until at, a planned arrival of a workload: the test's own
// schedule, not a wait for the service.
func arriveAt(at time.Time) { time.Sleep(time.Until(at)) }

// atMostEvery makes a costly condition (HTTP requests to the service) be
// asked at most once per d by testutil.WaitFor, which polls every
// millisecond, so that watching does not load the machine being watched.
func atMostEvery(d time.Duration, cond func() bool) func() bool {
	var last time.Time
	return func() bool {
		if time.Since(last) < d {
			return false
		}
		last = time.Now()
		return cond()
	}
}

// answerAfter is a downstream handler that takes d to answer status: a
// slow vendor (it gives up early only if the request is gone).
func answerAfter(d time.Duration, status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(status)
	}
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
