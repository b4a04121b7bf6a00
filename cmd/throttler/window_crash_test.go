package main

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// A window across a crash, on each store, judged on the kernel's receive
// times at the vendor: a tenant at 10/s with a window of 3 sends per W;
// three jobs; the vendor (HTTPS) starts its first three TLS handshakes
// 250 ms late, so each request is written well after its slot; it holds
// the third request's answer; and the process (embedded: SIGKILL, then a
// restart on the same file) or its worker (Redis: SIGKILL, then another
// worker takes the partition over) dies meanwhile. The third job goes
// again (with its key), and no W - 2 ms holds more than 3 arrivals: the
// windows count the first two sends at their writes, recorded with their
// outcomes, not at their slots. Counted at their slots, as before, the
// resend came W after the first slot, some 150 ms less than W after the
// first send.
func TestWindowCountsRealWritesAcrossACrash(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 of the throttler binary with a window")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	t.Run("Embedded", func(t *testing.T) {
		t.Parallel()
		windowAcrossCrash(t, "", 2*time.Second)
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		// Longer than the takeover (a 1 s lease runs out first).
		windowAcrossCrash(t, redistest.Start(t, false).URL(), 4*time.Second)
	})
}

// windowAcrossCrash runs the scenario on the embedded store (redisURL "")
// or on Redis, with a window of 3 per window.
func windowAcrossCrash(t *testing.T, redisURL string, window time.Duration) {
	const slow = 400 * time.Millisecond
	pki := tlstest.New(t)
	ds := downstreamtest.NewTLS(t, pki.ServerConfig(false))
	ds.SlowHandshakes(3, slow)
	var firstAttempts atomic.Int32
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Throttler-Attempt") == "1" && firstAttempts.Add(1) == 3 {
			<-r.Context().Done() // the third request's answer never comes while its sender lives
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	file := oneProcessConfig(t, redisURL, fmt.Sprintf("[downstreams.vendor]\nurl = %q\ntls_ca_file = %q\ntimeout = \"30s\"\n"+
		"[tenant_defaults]\ndownstream = \"vendor\"\nrate = \"10/s\"\ncapacity = 10\nwindows = [\"3/%v\"]\n", ds.URL+"/send", pki.CAFile, window))
	var senderArgs []string
	if redisURL != "" {
		senderArgs = []string{"--role", "worker"}
	}
	sender := startProcess(t, file, senderArgs...)
	api := sender
	if redisURL != "" {
		api = startProcess(t, file, "--role", "api")
		testutil.WaitFor(t, 10*time.Second, "the worker ready", func() bool {
			st, _, _ := call(t, "GET", sender.base+"/readyz", "")
			return st == http.StatusOK
		})
	}
	var ids []string
	for i := range 3 {
		st, _, body := call(t, "POST", api.base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != http.StatusAccepted {
			t.Fatalf("enqueue: %d %v", st, body)
		}
		ids = append(ids, body["id"].(string))
	}
	testutil.WaitFor(t, 10*time.Second, "the third request written", func() bool { return len(ds.All()) == 3 })
	// Only the third is in flight at the kill: the first two outcomes,
	// with their writes, are recorded.
	testutil.WaitFor(t, 10*time.Second, "the first two jobs recorded succeeded", func() bool {
		return jobState(t, api.base, ids[0])["state"] == "succeeded" && jobState(t, api.base, ids[1])["state"] == "succeeded"
	})
	firstLate := ds.All()[0].At.Sub(dispatchAt(t, api.base, ids[0]))
	sender.kill9(t)
	startProcess(t, file, senderArgs...) // the restart, or the worker that takes over
	testutil.WaitFor(t, 20*time.Second, "the third job sent again", func() bool { return len(ds.All()) == 4 })

	all := ds.All()
	for _, a := range all {
		t.Logf("  +%-10v %s attempt %s", a.At.Sub(all[0].At).Round(time.Millisecond), a.Key, a.Attempt)
	}
	if all[2].Key != ids[2] || all[3].Key != ids[2] {
		t.Fatalf("want the third job sent, then sent again: %v", all)
	}
	t.Logf("the first send %v after its slot", firstLate.Round(time.Millisecond))
	if firstLate < slow/2 {
		t.Fatalf("the first send came %v after its slot: the slow handshake was to make it later than %v", firstLate, slow/2)
	}
	if v := windowOver(all, window-downstreamtest.Jitter, 3); v != "" {
		t.Errorf("window 3/%v (the first send %v after its slot): %s", window, firstLate.Round(time.Millisecond), v)
	}
}

// windowOver names the first run of more than n arrivals within w, or "".
func windowOver(all []downstreamtest.Arrival, w time.Duration, n int) string {
	for i := range all {
		if j := i + n; j < len(all) && all[j].At.Sub(all[i].At) < w {
			return fmt.Sprintf("%d arrivals within %v (+%v to +%v)", n+1, all[j].At.Sub(all[i].At).Round(time.Millisecond),
				all[i].At.Sub(all[0].At).Round(time.Millisecond), all[j].At.Sub(all[0].At).Round(time.Millisecond))
		}
	}
	return ""
}

// dispatchAt is job id's dispatch time, as the API tells it.
func dispatchAt(t *testing.T, base, id string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(jobState(t, base, id)["dispatch_at"]))
	if err != nil {
		t.Fatal(err)
	}
	return at
}
