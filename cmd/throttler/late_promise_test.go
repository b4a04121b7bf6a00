package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// A promise behind a queue running late, on each store, judged on the
// kernel's receive times at the vendor: a tenant at 20/s; ten jobs at
// once; the vendor (HTTPS) starts its next three TLS handshakes 400 ms
// late. The requests of the first three slots wait for those connections
// while the gate writes the others in their turn, one interval apart, and
// then writes them behind: the queue runs three intervals (150 ms) late.
// Once the first two sends are recorded, a probe is admitted behind the
// rest: it arrives when its expected_delay_ms said, within DESIGN.md's
// max(50 ms, 5%). Promised its slot, as before, it arrived 150 ms after
// its promise.
func TestAPromiseCountsAQueueRunningLate(t *testing.T) {
	testutil.SkipShort(t, "process test: a vendor's slow handshake makes a queue late")
	onEachStore(t, promiseBehindLateQueue)
}

// promiseBehindLateQueue runs the scenario on the embedded store (redisURL
// "") or on Redis (one process, API and worker, one partition).
func promiseBehindLateQueue(t *testing.T, redisURL string) {
	const slow, ahead = 400 * time.Millisecond, 10
	pki := tlstest.New(t)
	ds := downstreamtest.NewTLS(t, pki.ServerConfig(false))
	ds.Answer(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	p := startReady(t, oneProcessConfig(t, redisURL,
		fmt.Sprintf("[downstreams.vendor]\nurl = %q\ntls_ca_file = %q\n[tenant_defaults]\ndownstream = \"vendor\"\nrate = \"20/s\"\ncapacity = 100\n",
			ds.URL+"/send", pki.CAFile)))
	ds.SlowHandshakes(3, slow) // the first requests' connections
	var batch []string
	for i := range ahead {
		batch = append(batch, fmt.Sprintf(`{"payload":{"n":%d}}`, i))
	}
	st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs:batch", `{"jobs":[`+strings.Join(batch, ",")+`]}`)
	if st != http.StatusOK && st != http.StatusAccepted {
		t.Fatalf("batch: %d %v", st, body)
	}
	first := body["results"].([]any)[0].(map[string]any)["id"].(string)
	// The slow handshakes make the first sends late, whichever connection
	// each request gets: the queue is as late as its first arrival after
	// the first slot. The probe goes once the first two are recorded.
	testutil.WaitFor(t, 10*time.Second, "two sends", func() bool { return len(ds.All()) >= 2 })
	early := ds.All()[:2]
	testutil.WaitFor(t, 10*time.Second, "the first two sends recorded succeeded", func() bool {
		return jobState(t, p.base, early[0].Key)["state"] == "succeeded" && jobState(t, p.base, early[1].Key)["state"] == "succeeded"
	})
	queueLate := early[0].At.Sub(dispatchAt(t, p.base, first))
	sent := time.Now()
	st, _, probe := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":{"probe":true}}`)
	answered := time.Now()
	if st != http.StatusAccepted {
		t.Fatalf("probe: %d %v", st, probe)
	}
	id := probe["id"].(string)
	promised := time.Duration(probe["expected_delay_ms"].(float64) * float64(time.Millisecond))
	testutil.WaitFor(t, 10*time.Second, "the probe sent", func() bool { return ds.Keys()[id] > 0 })
	var arrived time.Time
	all := ds.All()
	for _, a := range all {
		t.Logf("  +%-10v %s", a.At.Sub(all[0].At).Round(time.Millisecond), a.Key)
		if a.Key == id {
			arrived = a.At
		}
	}
	t.Logf("the first arrival %v after the first slot; the probe promised %v, arrived %v after its request", queueLate.Round(time.Millisecond),
		promised.Round(time.Millisecond), arrived.Sub(sent).Round(time.Millisecond))
	if queueLate < slow/4 {
		t.Fatalf("the first arrival came %v after the first slot: the slow handshakes were to make it later than %v", queueLate, slow/4)
	}
	// The promise counts from the decision, somewhere between the request
	// and its answer: earliness from the request, lateness from the answer.
	tol := max(50*time.Millisecond, promised/20)
	if early := sent.Add(promised).Sub(arrived); early > tol {
		t.Errorf("the probe arrived %v before its promise (tolerance %v)", early.Round(time.Millisecond), tol)
	}
	if late := arrived.Sub(answered.Add(promised)); late > tol {
		t.Errorf("the probe arrived %v after its promise (tolerance %v)", late.Round(time.Millisecond), tol)
	}
}
