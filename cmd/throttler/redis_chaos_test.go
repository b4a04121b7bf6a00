package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The chaos run as a demanding user ran it: five tenants at 10/s, 30
// jobs each with the client's keys, posted at once through an API process;
// two workers. Worker 1 is killed with SIGKILL at +0.7 s; Redis (AOF,
// appendfsync everysec) is killed at +1.4 s and restarted 0.7 s later,
// and worker 1 with it; worker 2 is killed at +2.9 s. Every arrival of
// every tenant is checked at the downstream: every job arrives, a repeat
// carries its key and its payload, and no two of a tenant closer than
// T - 2 ms (the window rule over every window). For a pair too close the
// test names the workers that sent each and how late the first went
// against its dispatch time.
func TestRedisChaosKeepsEveryTenantSpaced(t *testing.T) {
	testutil.SkipShort(t, "process test: kills throttler processes and their redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	const tenants, perTenant = 5, 30
	const T = 100 * time.Millisecond // 10/s
	srv := redistest.Start(t, true)
	srv.SeenPartitions(t, 8) // a Redis in use: its partitions are taken at once (item 1 is another test's)
	ds := downstreamtest.New(t)
	var mu sync.Mutex
	sender := map[time.Time]string{} // an arrival's time: the worker that sent it (its path)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sender[downstreamtest.ArrivalTime(r)] = strings.TrimPrefix(r.URL.Path, "/")
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	start := func(name string, role string) *process {
		file := filepath.Join(t.TempDir(), name+".toml")
		cfg := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n[store]\nbackend = \"redis\"\nredis_url = %q\nredis_lease = \"1s\"\nredis_partitions = 8\n"+
			"[downstreams.test]\nurl = %q\ntimeout = \"2s\"\n[tenant_defaults]\nrate = \"10/s\"\ncapacity = 100\n", srv.URL(), ds.URL+"/"+name)
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return startProcess(t, file, "--role", role)
	}
	api := start("api", "api")
	w1 := start("w1", "worker")
	w2 := start("w2", "worker")
	testutil.WaitFor(t, 10*time.Second, "both workers ready", func() bool {
		for _, p := range []*process{w1, w2} {
			if st, _ := callRaw(t, "GET", p.base+"/readyz", ""); st != http.StatusOK {
				return false
			}
		}
		return true
	})
	names := postAtOnce(t, api.base, tenants, perTenant)
	began := time.Now()
	// The test's own schedule (the moments of the faults), not a wait for
	// the service: any moments will do, these are the issue's.
	at := func(d time.Duration) { time.Sleep(time.Until(began.Add(d))) }
	at(700 * time.Millisecond)
	w1.kill9(t)
	at(1400 * time.Millisecond)
	srv.Kill()
	at(2100 * time.Millisecond)
	srv.Restart()
	start("w1b", "worker")
	at(2900 * time.Millisecond)
	w2.kill9(t)

	all, repeats := awaitEveryKey(t, ds, names, T)
	t.Logf("%d jobs, %d arrivals, %d repeats (each with its key)", len(names), len(all), repeats)
	closest, across := time.Hour, time.Hour // across: a pair sent by two workers (a handover)
	for tn := range tenants {
		arr := ds.Of(fmt.Sprintf("t%d", tn))
		for i := 1; i < len(arr); i++ {
			gap := arr[i].At.Sub(arr[i-1].At)
			closest = min(closest, gap)
			mu.Lock()
			by0, by1 := sender[arr[i-1].At], sender[arr[i].At]
			mu.Unlock()
			if by0 != by1 {
				across = min(across, gap)
			}
			if gap >= T-downstreamtest.Jitter {
				continue
			}
			first := jobState(t, api.base, arr[i-1].Key)
			late := "its dispatch time unknown"
			if due, ok := dispatchAtOf(first); ok {
				late = fmt.Sprintf("%v after its dispatch time", arr[i-1].At.Sub(due).Round(10*time.Microsecond))
			}
			t.Errorf("tenant t%d: %s (attempt %s, by %s, +%v, %s) then %s (attempt %s, by %s, +%v) %v apart, under T - 2 ms",
				tn, names[arr[i-1].Key], arr[i-1].Attempt, by0, arr[i-1].At.Sub(began).Round(time.Millisecond), late,
				names[arr[i].Key], arr[i].Attempt, by1, arr[i].At.Sub(began).Round(time.Millisecond), gap.Round(10*time.Microsecond))
		}
		if v := downstreamtest.WindowViolation(arr, T, 1); v != "" {
			t.Errorf("tenant t%d: %s", tn, v)
		}
	}
	t.Logf("closest pair of one tenant: %v; closest sent by two workers: %v (T = %v)", closest.Round(10*time.Microsecond), across.Round(10*time.Microsecond), T)
}
