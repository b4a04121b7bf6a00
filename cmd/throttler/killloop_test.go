package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The kill loop as a demanding user ran it: six tenants at
// 20/s, 40 jobs each with the client's idempotency keys, all posted at
// once; the process killed with SIGKILL five times, 250-650 ms apart, and
// started again at once each time. Every arrival of every tenant is checked
// at the downstream: no two of a tenant closer than T - 2 ms (the window
// rule over every window, in fact), every arrival's Idempotency-Key a job
// that was accepted and its payload that job's (a repeat carries its key),
// every job delivered.
//
// Beside TestRepeatedKill9KeepsSpacing (crash_test.go), which posts the
// jobs one after the other without keys, this one races the 240 admissions
// (every tenant's schedule starts together), gives each job a client key,
// checks each repeat's payload, names each pair it finds too close, and
// logs the closest pair across each kill: the margin the restart left.
func TestKill9LoopKeepsEveryTenantSpaced(t *testing.T) {
	testutil.SkipShort(t, "process test: a kill -9 loop of the throttler binary")
	t.Run("InstantVendor", func(t *testing.T) { killLoop(t, 0) })
	// A vendor that takes up to 150 ms to answer (an SMS gateway's
	// usual): most kills then cut attempts under way, whose requests
	// reached the vendor and whose outcomes were never written, so each
	// restart has several jobs that may have been sent to space after.
	t.Run("SlowVendor", func(t *testing.T) { killLoop(t, 150*time.Millisecond) })
}

func killLoop(t *testing.T, answerUpTo time.Duration) {
	const tenants, perTenant, kills = 6, 40, 5
	const T = 50 * time.Millisecond // 20/s
	ds := downstreamtest.New(t)
	if answerUpTo > 0 {
		ds.Answer(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(rand.N(answerUpTo)) // the vendor's own time to answer
			w.WriteHeader(http.StatusOK)
		})
	}
	file := writeConfig(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 100\n", ds)
	p := startProcess(t, file)
	names := postAtOnce(t, p.base, tenants, perTenant)

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 25))
	var restarts []time.Duration
	var killedAt []time.Time
	for k := range kills {
		// The test's own schedule (the moment of each crash), not a wait
		// for the service: any moment will do.
		time.Sleep(time.Duration(250+rng.IntN(400)) * time.Millisecond)
		killed := time.Now()
		p.kill9(t)
		killedAt = append(killedAt, killed)
		n := len(ds.All())
		p = startProcess(t, file)
		restarts = append(restarts, time.Since(killed))
		t.Logf("kill %d after %d arrivals; listening again %v after the kill", k+1, n, restarts[k].Round(time.Millisecond))
	}
	all, repeats := awaitEveryKey(t, ds, names, T)
	t.Logf("seed %d: %d jobs, %d kills, %d arrivals, %d repeats (each with its key)", seed, len(names), kills, len(all), repeats)
	closest := time.Hour
	for tn := range tenants {
		arr := ds.Of(fmt.Sprintf("t%d", tn))
		for i := 1; i < len(arr); i++ {
			gap := arr[i].At.Sub(arr[i-1].At)
			closest = min(closest, gap)
			if gap < T-downstreamtest.Jitter {
				t.Errorf("tenant t%d: %s then %s (attempt %s) %v apart, under T - 2 ms", tn,
					names[arr[i-1].Key], names[arr[i].Key], arr[i].Attempt, gap.Round(10*time.Microsecond))
			}
		}
		if v := downstreamtest.WindowViolation(arr, T, 1); v != "" {
			t.Errorf("tenant t%d: %s", tn, v)
		}
	}
	t.Logf("closest pair of one tenant: %v (T = %v); closest across a kill: %v", closest.Round(10*time.Microsecond), T,
		closestAcross(ds, tenants, killedAt).Round(10*time.Microsecond))
}

// closestAcross is the shortest gap, over tenants and kills, between a
// tenant's last arrival before a kill and its first after it: the margin
// the restart left.
func closestAcross(ds *downstreamtest.Server, tenants int, kills []time.Time) time.Duration {
	closest := time.Hour
	for tn := range tenants {
		arr := ds.Of(fmt.Sprintf("t%d", tn))
		for _, k := range kills {
			i := 0
			for i < len(arr) && arr[i].At.Before(k) {
				i++
			}
			if i > 0 && i < len(arr) {
				closest = min(closest, arr[i].At.Sub(arr[i-1].At))
			}
		}
	}
	return closest
}

// postAtOnce posts perTenant jobs to each of tenants t0.. at once, job i of
// tenant n with the idempotency key "kn-i" and that key in its payload, and
// returns the accepted jobs' keys by id.
func postAtOnce(t *testing.T, base string, tenants, perTenant int) map[string]string {
	t.Helper()
	var mu sync.Mutex
	names := map[string]string{}
	var failed []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for tn := range tenants {
		for i := range perTenant {
			key := fmt.Sprintf("k%d-%d", tn, i)
			wg.Go(func() {
				<-start
				body := fmt.Sprintf(`{"payload":{"key":%q},"idempotency_key":%q}`, key, key)
				resp, err := httpClient.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs", base, tn), "application/json", strings.NewReader(body))
				var got struct {
					ID string `json:"id"`
				}
				if err == nil {
					err = json.NewDecoder(resp.Body).Decode(&got)
					resp.Body.Close()
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil || resp.StatusCode != http.StatusAccepted {
					failed = append(failed, fmt.Sprintf("%s: %v %v", key, err, resp))
					return
				}
				names[got.ID] = key
			})
		}
	}
	close(start)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d jobs not accepted: %v", len(failed), failed)
	}
	return names
}

// awaitEveryKey waits until every accepted job (names: id -> key) has
// arrived, then three intervals more (a late repeat would come then), and
// checks every arrival with checkKeys: it returns them and the repeats.
func awaitEveryKey(t *testing.T, ds *downstreamtest.Server, names map[string]string, T time.Duration) ([]downstreamtest.Arrival, int) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, "every accepted job delivered", func() bool {
		n := 0
		for key := range ds.Keys() {
			if _, ok := names[key]; ok {
				n++
			}
		}
		return n == len(names)
	})
	nothingMoreWithin(3 * T)
	all := ds.All()
	return all, checkKeys(t, all, names)
}

// checkKeys fails t unless every arrival is of an accepted job and carries
// that job's payload, and returns how many arrivals were repeats.
func checkKeys(t *testing.T, all []downstreamtest.Arrival, names map[string]string) int {
	t.Helper()
	seen := map[string]bool{}
	repeats := 0
	for _, a := range all {
		key, ok := names[a.Key]
		if !ok {
			t.Fatalf("delivered Idempotency-Key %q that was never accepted", a.Key)
		}
		if !strings.Contains(a.Body, fmt.Sprintf("%q", key)) {
			t.Fatalf("job %s (%s) arrived with another job's payload: %s", a.Key, key, a.Body)
		}
		if seen[a.Key] {
			repeats++
		}
		seen[a.Key] = true
	}
	return repeats
}
