package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Promises to a trickle, on each store, judged on the kernel's receive
// times at the vendor: jobs posted one at a time every 80 ms to a tenant
// at 10/s, so each waits a little longer than the one before (20 ms
// more). Every job arrives when its expected_delay_ms said, within
// DESIGN.md's max(50 ms, 5%): a wake-up of the dispatcher missed or late
// would send a job an interval (100 ms) after its promise. A job late by
// no more than the machine stalled while it waited (testutil.Stalls) is
// counted apart: a missed wake-up on a machine that ran still fails.
func TestPromisesToATrickle(t *testing.T) {
	testutil.SkipShort(t, "process test: promises to jobs posted one at a time")
	onEachStore(t, promisesToATrickle)
}

func promisesToATrickle(t *testing.T, redisURL string) {
	const jobs, every = 30, 80 * time.Millisecond
	machine := testutil.StartStalls(t)
	ds := downstreamtest.New(t)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	p := startReady(t, oneProcessConfig(t, redisURL,
		fmt.Sprintf("[downstreams.vendor]\nurl = %q\n[tenant_defaults]\ndownstream = \"vendor\"\nrate = \"10/s\"\ncapacity = 100\n", ds.URL+"/send")))
	// A first job, sent: the partition has its owner (a new Redis holds
	// it vacant for a lease, which the promises would count), and the
	// trickle starts an interval after it, on an idle tenant.
	st, _, warm := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":{"warm":true}}`)
	if st != http.StatusAccepted {
		t.Fatalf("first job: %d %v", st, warm)
	}
	testutil.WaitFor(t, 20*time.Second, "the first job sent", func() bool { return ds.Keys()[warm["id"].(string)] > 0 })
	time.Sleep(100 * time.Millisecond)
	type posted struct {
		id             string
		sent, answered time.Time
		promised       time.Duration
	}
	var all []posted
	next := time.Now()
	for i := range jobs {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		sent := time.Now()
		st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		answered := time.Now()
		if st != http.StatusAccepted {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		all = append(all, posted{body["id"].(string), sent, answered, time.Duration(body["expected_delay_ms"].(float64) * float64(time.Millisecond))})
	}
	testutil.WaitFor(t, 20*time.Second, "every job sent", func() bool { return len(ds.Keys()) >= jobs+1 })
	arrived := map[string]time.Time{}
	for _, a := range ds.All() {
		if _, seen := arrived[a.Key]; !seen {
			arrived[a.Key] = a.At
		}
	}
	worst, excused := time.Duration(0), 0
	for i, j := range all {
		at := arrived[j.id]
		// The promise counts from the decision, somewhere between the
		// request and its answer: earliness from the request, lateness
		// from the answer.
		tol := max(50*time.Millisecond, j.promised/20)
		early, late := j.sent.Add(j.promised).Sub(at), at.Sub(j.answered.Add(j.promised))
		if st := machine.Within(j.sent, at); late > tol && late-tol <= st && early <= tol {
			excused++
			continue
		}
		worst = max(worst, late)
		if early > tol || late > tol {
			t.Errorf("job %d: promised %v, arrived %v after its request (%v early, %v late; tolerance %v)", i,
				j.promised.Round(time.Millisecond), at.Sub(j.sent).Round(time.Millisecond), early.Round(time.Millisecond), late.Round(time.Millisecond), tol)
		}
	}
	t.Logf("%d jobs every %v at 10/s: the last promised %v; latest arrival %v after its promise; %d late by no more than the machine stalled while they waited (worst stall %v)", jobs, every,
		all[jobs-1].promised.Round(time.Millisecond), worst.Round(time.Millisecond), excused, machine.Worst().Round(time.Millisecond))
}
