package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Caps on attempts in flight, as a vendor that allows N open requests sees
// them: a vendor that counts its open requests and answers each 200 ms
// after it came, tenants at 50/s (the cap binds: 3 open at 200 ms each is
// 15/s), and a kill -9 of the process (a worker, on Redis) while requests
// are open. The vendor never has more open than the cap: not after the
// restart either, while the requests the dead process wrote are still
// open there. Every job is delivered; a job repeats only with its key.
func TestInFlightCapHoldsAtTheVendor(t *testing.T) {
	testutil.SkipShort(t, "process test: caps on attempts in flight, across a kill -9")
	t.Parallel() // waits on real time: overlapped with the other parallel tests
	const tenantCap = "max_in_flight = 0\n[tenant_defaults]\nrate = \"50/s\"\ncapacity = 200\nmax_in_flight = 3\n"
	const sharedCap = "max_in_flight = 3\n[tenant_defaults]\nrate = \"50/s\"\ncapacity = 200\n"
	for _, c := range []struct {
		name, body         string
		tenants, perTenant int
	}{
		{"TenantCap", tenantCap, 1, 60},
		{"DownstreamCapSharedBy20", sharedCap, 20, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // waits on real time and other processes
			t.Run("embedded", func(t *testing.T) {
				capRun(t, "", c.body, c.tenants, c.perTenant)
			})
			t.Run("redis-two-workers", func(t *testing.T) {
				capRun(t, redistest.Start(t, false).URL(), c.body, c.tenants, c.perTenant)
			})
		})
	}
}

// openCounter is a vendor's count of its open requests.
type openCounter struct {
	mu         sync.Mutex
	open, most int
	answered   int
}

func (o *openCounter) answer(after time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.open++
		o.most = max(o.most, o.open)
		o.mu.Unlock()
		time.Sleep(after) // whether or not the client is still there
		o.mu.Lock()
		o.open--
		o.answered++
		o.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}
}

func (o *openCounter) read() (open, most, answered int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.open, o.most, o.answered
}

// capRun posts perTenant jobs to each of tenants t0.. (each with a key),
// kills the process that sends (on Redis, one of two workers beside an
// API) once a third are answered and while requests are open, starts it
// again, and checks the vendor's count and every arrival.
func capRun(t *testing.T, redisURL, body string, tenants, perTenant int) {
	const capN = 3
	ds := downstreamtest.New(t)
	vendor := &openCounter{}
	ds.Answer(vendor.answer(200 * time.Millisecond))
	file, api, senders, role := startSenders(t, redisURL, body, ds)
	names := postAtOnce(t, api.base, tenants, perTenant)
	total := tenants * perTenant
	testutil.WaitFor(t, 30*time.Second, "a third of the jobs answered", func() bool {
		_, _, answered := vendor.read()
		return answered >= total/3
	})
	sender := sending(t, senders)
	open, _, _ := vendor.read()
	sender.kill9(t)
	killed := time.Now()
	startProcess(t, file, role...)
	t.Logf("killed with %d requests open at the vendor; started again %v after", open, time.Since(killed).Round(time.Millisecond))
	all, repeats := awaitEveryKey(t, ds, names, 200*time.Millisecond)
	_, most, _ := vendor.read()
	first, last := all[0].At, all[len(all)-1].At
	t.Logf("%d jobs over %d tenants, %d arrivals (%d repeats, each with its key) in %v; most open at the vendor at once: %d (cap %d)",
		total, tenants, len(all), repeats, last.Sub(first).Round(time.Millisecond), most, capN)
	if most > capN {
		t.Fatalf("the vendor had %d requests open at once: the cap is %d", most, capN)
	}
	if most < capN {
		t.Errorf("the vendor never had %d requests open at once (most %d): the cap held sends back further than it allows", capN, most)
	}
	if repeats > capN {
		t.Errorf("%d repeats: only the %d attempts in flight at the kill may repeat", repeats, capN)
	}
	for tn := range tenants { // the rate still holds under the cap
		downstreamtest.CheckWindows(t, ds.Of(fmt.Sprintf("t%d", tn)), 20*time.Millisecond, 1)
	}
}

// startSenders starts, on the config body, one process (redisURL "": the
// embedded store) or, on Redis, an API process and two workers; it returns
// the config's file, the process to post to, those that send and the
// arguments that start another sender.
func startSenders(t *testing.T, redisURL, body string, ds *downstreamtest.Server) (file string, api *process, senders []*process, role []string) {
	t.Helper()
	if redisURL == "" {
		file = writeConfig(t, body, ds)
		api = startProcess(t, file)
		return file, api, []*process{api}, nil
	}
	file = redisConfig(t, redisURL, "standalone", body, ds)
	role = []string{"--role", "worker"}
	api = startProcess(t, file, "--role", "api")
	return file, api, []*process{startProcess(t, file, role...), startProcess(t, file, role...)}, role
}

// sending is the first of processes seen to make an attempt from now on.
func sending(t *testing.T, processes []*process) *process {
	t.Helper()
	const series = `throttler_attempts_total{class="2xx",downstream="test"}`
	before := make([]float64, len(processes))
	for i, p := range processes {
		before[i] = value(scrape(t, p.base), series)
	}
	var found *process
	testutil.WaitFor(t, 10*time.Second, "a process making an attempt", func() bool {
		for i, p := range processes {
			if value(scrape(t, p.base), series) > before[i] {
				found = p
				return true
			}
		}
		return false
	})
	return found
}
