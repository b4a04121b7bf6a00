package main

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// kill -9 again and again, restarted at once each time, while six tenants
// drain their backlogs: every restart spaces each tenant from the last
// moment any of its jobs could have been written before the crash, repeats
// included, so no two sends of one tenant are ever closer than T - 2 ms at
// the downstream; nothing accepted is lost.
func TestRepeatedKill9KeepsSpacing(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 and restart of the throttler binary, again and again")
	const tenants, perTenant, kills = 6, 40, 5
	const T = 50 * time.Millisecond // 20/s
	ds := downstreamtest.New(t)
	file := writeConfig(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 100\n", ds)
	p := startProcess(t, file)
	accepted := map[string]bool{}
	for tn := range tenants {
		for i := range perTenant {
			st, _, body := call(t, "POST", fmt.Sprintf("%s/v1/tenants/t%d/jobs", p.base, tn), fmt.Sprintf(`{"payload":{"n":%d}}`, i))
			if st != 202 {
				t.Fatalf("tenant %d job %d: %d %v", tn, i, st, body)
			}
			accepted[body["id"].(string)] = true
		}
	}
	rng := rand.New(rand.NewPCG(12, 1))
	for k := range kills {
		time.Sleep(time.Duration(250+rng.IntN(400)) * time.Millisecond) // the moment of the crash: any will do
		p.kill9(t)
		t.Logf("kill %d after %d arrivals", k+1, len(ds.All()))
		p = startProcess(t, file)
	}
	testutil.WaitFor(t, 60*time.Second, "every accepted job delivered", func() bool {
		n := 0
		for key := range ds.Keys() {
			if accepted[key] {
				n++
			}
		}
		return n == len(accepted)
	})
	repeats := 0
	for key, n := range ds.Keys() {
		if !accepted[key] {
			t.Fatalf("delivered Idempotency-Key %q that was never accepted", key)
		}
		repeats += n - 1
	}
	t.Logf("%d jobs, %d kills, %d repeats (same Idempotency-Key)", len(accepted), kills, repeats)
	for tn := range tenants {
		downstreamtest.CheckWindows(t, ds.Of(fmt.Sprintf("t%d", tn)), T, 1)
	}
}
