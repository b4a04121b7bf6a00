package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/servicetest"
	"github.com/throttler-dev/throttler/internal/testutil"
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
func send(t testing.TB, method, url string, body string, header ...string) (int, http.Header, []byte) {
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
func call(t testing.TB, method, url string, body string, header ...string) (int, http.Header, map[string]any) {
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

// enqueueN enqueues n jobs {"n": i} for tenant and returns their ids.
func enqueueN(t *testing.T, base, tenant string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		st, _, body := call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != 202 {
			t.Fatalf("%s job %d: %d %v", tenant, i, st, body)
		}
		ids = append(ids, body["id"].(string))
	}
	return ids
}

// jobState is the API's answer for job id.
func jobState(t *testing.T, base, id string) map[string]any {
	t.Helper()
	_, _, j := call(t, "GET", base+"/v1/jobs/"+id, "")
	return j
}

// waitAllSucceeded waits until every job of ids has succeeded, asking the
// API every 50 ms; if they have not within timeout, it logs those that have
// not before failing.
func waitAllSucceeded(t *testing.T, base string, ids []string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout - 100*time.Millisecond)
	logged := false
	testutil.WaitFor(t, timeout, "every job delivered", atMostEvery(50*time.Millisecond, func() bool {
		if allSucceeded(t, base, ids) {
			return true
		}
		if time.Now().After(deadline) && !logged {
			logged = true
			for _, id := range ids {
				if j := jobState(t, base, id); j["state"] != "succeeded" {
					t.Logf("job %s: %v", id, j)
				}
			}
		}
		return false
	}))
}

// allSucceeded says whether every job of ids has succeeded.
func allSucceeded(t *testing.T, base string, ids []string) bool {
	for _, id := range ids {
		if jobState(t, base, id)["state"] != "succeeded" {
			return false
		}
	}
	return true
}

// readBody is a request's body, as far as it could be read.
func readBody(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// scrape is the service's /metrics.
func scrape(t *testing.T, base string) string {
	t.Helper()
	st, body := callRaw(t, "GET", base+"/metrics", "")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, body)
	}
	return body
}

// value is the value of one series in a scrape (-1 if absent).
func value(scraped, series string) float64 {
	for _, line := range strings.Split(scraped, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return -1
}

// behind is how far behind its schedule the sender already was when a
// job was admitted: the first send of its tenant (of, by time) after
// admitted, other than the job itself, against that send's dispatch time
// (dispatchAt, by Idempotency-Key; false: unknown), less the Jitter. A
// send written late moves every send after it, as a stall does (see
// stalls), and the first one after an admission is not a gap stalls
// sees. 0 if it was on time.
func behind(of []downstreamtest.Arrival, admitted time.Time, job string, dispatchAt func(key string) (time.Time, bool)) time.Duration {
	for _, a := range of {
		if !a.At.After(admitted) {
			continue
		}
		if a.Key == job {
			return 0
		}
		at, ok := dispatchAt(a.Key)
		if !ok {
			return 0
		}
		return max(0, a.At.Sub(at)-downstreamtest.Jitter)
	}
	return 0
}

// dispatchAtOf reads a job's dispatch_at from its admission answer (or a
// GET of it): false if it has none.
func dispatchAtOf(body map[string]any) (time.Time, bool) {
	s, _ := body["dispatch_at"].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	return at, err == nil
}

// stalls is how much of a job's wait its tenant's sends ahead of it spent
// beyond their spacing: the sum of the gaps over T + Jitter between
// consecutive arrivals of its tenant (of, by time) after it was admitted
// and up to its own arrival. A send written late (the machine did not
// give the sender the CPU) moves every send after it, a job's promise
// too, and is the sender's, not the promise's: promises are judged late
// less these stalls, early as they are (TestRedisFaultsBetweenWorkerAndRedis
// does the same).
func stalls(of []downstreamtest.Arrival, admitted, arrived time.Time, T time.Duration) time.Duration {
	var d time.Duration
	for i := 1; i < len(of); i++ {
		if of[i-1].At.After(admitted) && !of[i].At.After(arrived) {
			d += max(0, of[i].At.Sub(of[i-1].At)-T-downstreamtest.Jitter)
		}
	}
	return d
}

// storeSection is a config's [store] for a one-process test: the embedded
// store in dir, or, with a redisURL, Redis with one partition (the
// process owns every tenant) and a 1 s lease.
func storeSection(dir, redisURL string) string {
	if redisURL != "" {
		return fmt.Sprintf("[store]\nbackend = \"redis\"\nredis_url = %q\nredis_lease = \"1s\"\nredis_partitions = 1\n", redisURL)
	}
	return fmt.Sprintf("[store]\npath = %q\n", filepath.Join(dir, "throttler.db"))
}

// oneProcessConfig writes a config with a listener on a free port, the
// store of storeSection, then body (downstreams and tenants), and returns
// its path.
func oneProcessConfig(t *testing.T, redisURL, body string) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.toml")
	cfg := "[server]\nlisten = \"127.0.0.1:0\"\n" + storeSection(dir, redisURL) + body
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// startReady starts a process on file and waits until /readyz answers 200.
func startReady(t *testing.T, file string) *process {
	t.Helper()
	p := startProcess(t, file)
	testutil.WaitFor(t, 10*time.Second, "the process ready", func() bool {
		st, _, _ := call(t, "GET", p.base+"/readyz", "")
		return st == http.StatusOK
	})
	return p
}

// onEachStore runs a scenario on the embedded store and on a Redis of its
// own (redisURL ""; or the Redis's URL).
func onEachStore(t *testing.T, scenario func(t *testing.T, redisURL string)) {
	t.Run("embedded", func(t *testing.T) { scenario(t, "") })
	t.Run("redis", func(t *testing.T) { scenario(t, redistest.Start(t, false).URL()) })
}
