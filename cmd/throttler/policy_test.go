package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// plansConfig: every tenant is free (2/s) unless given pro (10/s).
const plansConfig = `[plans.free]
rate = "2/s"
capacity = 200
[plans.pro]
rate = "10/s"
capacity = 10000
[tenant_defaults]
plan = "free"
`

// A tenant moved from free (2/s, the file's) to pro (10/s) by the API
// while 100 of its jobs wait: the process that sends it (on Redis, a worker
// beside the API's process, which took the change through Redis) paces it
// at pro's rate within a second, its waiting jobs brought forward; pro
// outlives a kill -9 of every process (on Redis, the other worker paces it
// at pro after a kill -9 of the one sending); DELETE gives the file's rate
// back within a second (after two reloads of the file: one that keeps the
// policy, one refused for the plan it lacks). Every job arrives, a repeat only with its key, and
// no two arrivals are closer than pro's interval.
func TestPolicyMovesATenantAtOnce(t *testing.T) {
	testutil.SkipShort(t, "process test: a tenant's policy set by the API, across kill -9s")
	t.Parallel() // waits on real time: overlapped with the other parallel tests
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		policyRun(t, "")
	})
	t.Run("redis-api-and-two-workers", func(t *testing.T) {
		t.Parallel()
		policyRun(t, redistest.Start(t, false).URL())
	})
}

func policyRun(t *testing.T, redisURL string) {
	const pro, free = 100 * time.Millisecond, 500 * time.Millisecond
	ds := downstreamtest.New(t)
	var file string
	var api *process
	var senders []*process
	var role []string // the senders'
	start := func() {
		if redisURL == "" {
			api = startProcess(t, file)
			senders = []*process{api}
			return
		}
		api = startProcess(t, file, "--role", "api")
		senders = []*process{startProcess(t, file, role...), startProcess(t, file, role...)}
	}
	if redisURL == "" {
		file = writeConfig(t, plansConfig, ds)
	} else {
		file = redisConfig(t, redisURL, "standalone", plansConfig, ds)
		role = []string{"--role", "worker"}
	}
	start()
	names := postAtOnce(t, api.base, 1, 100) // tenant t0, free: 50 s of backlog
	testutil.WaitFor(t, 10*time.Second, "three arrivals at free's rate", func() bool { return len(ds.Of("t0")) >= 3 })
	spacedAt(t, ds, "before the move", ds.Of("t0")[0].At, free)

	put := time.Now()
	if st, _, body := call(t, "PUT", api.base+"/v1/tenants/t0/policy", `{"plan":"pro"}`); st != 200 || body["plan"] != "pro" || body["plan_from"] != "api" {
		t.Fatalf("PUT pro: %d %v", st, body)
	}
	pacedAt(t, ds, "a second after the move to pro", put.Add(time.Second), pro)
	if _, _, body := call(t, "GET", api.base+"/v1/jobs/"+lastOf(names), ""); !dueBy(body, put.Add(15*time.Second)) {
		t.Errorf("the backlog's last job after the move: %v; want it due within 15 s (100 at 10/s), not at free's 50 s", body["dispatch_at"])
	}

	if redisURL != "" { // the other worker, once the one sending is gone
		gone := sending(t, senders)
		gone.kill9(t)
		killed := time.Now()
		senders = slices.DeleteFunc(senders, func(p *process) bool { return p == gone })
		testutil.WaitFor(t, 10*time.Second, "an arrival after the kill", func() bool { return len(after(ds.Of("t0"), killed)) > 0 })
		pacedAt(t, ds, "after a kill -9 of the worker that sent it", after(ds.Of("t0"), killed)[0].At, pro)
		senders = append(senders, startProcess(t, file, role...))
	}
	for _, p := range senders {
		if p != api {
			p.kill9(t)
		}
	}
	api.kill9(t)
	restarted := time.Now()
	start()
	if _, _, body := call(t, "GET", api.base+"/v1/tenants/t0/policy", ""); body["plan"] != "pro" || body["plan_from"] != "api" {
		t.Fatalf("after a kill -9 of every process, the policy is %v", body)
	}
	testutil.WaitFor(t, 10*time.Second, "an arrival after the restart", func() bool { return len(after(ds.Of("t0"), restarted)) > 0 })
	pacedAt(t, ds, "after a kill -9 and restart of every process", after(ds.Of("t0"), restarted)[0].At, pro)

	// A reload keeps the API's layer; one whose file lacks the plan a
	// policy names is refused, and the running config kept.
	original, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	api.reload(t, file, string(original)+"[tenants.other]\nrate = \"3/s\"\n", "config reloaded")
	api.reload(t, file, strings.Replace(string(original), "[plans.pro]", "[plans.team]", 1), "config reload refused")
	if _, _, body := call(t, "GET", api.base+"/v1/tenants/t0/policy", ""); body["plan"] != "pro" || body["plan_from"] != "api" {
		t.Fatalf("after two reloads, the policy is %v", body)
	}
	if !strings.Contains(api.logs(), `tenant \"t0\"'s policy, set by the API`) {
		t.Errorf("the refused reload does not name the tenant whose policy needs the plan:\n%s", api.logs())
	}

	dropped := time.Now()
	if st, _, body := call(t, "DELETE", api.base+"/v1/tenants/t0/policy", ""); st != 200 || body["plan"] != "free" || body["api"] != nil {
		t.Fatalf("DELETE: %d %v", st, body)
	}
	spacedAt(t, ds, "a second after the DELETE", dropped.Add(time.Second), free)

	put = time.Now()
	call(t, "PUT", api.base+"/v1/tenants/t0/policy", `{"plan":"pro"}`) // the rest at pro
	pacedAt(t, ds, "a second after pro again", put.Add(time.Second), pro)
	all, repeats := awaitEveryKey(t, ds, names, pro)
	t.Logf("%d jobs, %d arrivals (%d repeats, each with its key) in %v", len(names), len(all), repeats, all[len(all)-1].At.Sub(all[0].At).Round(time.Millisecond))
	if repeats > 4 {
		t.Errorf("%d repeats: only attempts in flight at the kills may repeat", repeats)
	}
	downstreamtest.CheckWindows(t, all, pro, 1)
}

// lastOf is the id of the job posted last (names: id -> key k0-N).
func lastOf(names map[string]string) string {
	last, most := "", -1
	for id, key := range names {
		var n int
		if _, err := fmt.Sscanf(key, "k0-%d", &n); err == nil && n > most {
			last, most = id, n
		}
	}
	return last
}

// dueBy reports whether a job (as GET /v1/jobs/{id} shows it) is due by at.
func dueBy(job map[string]any, at time.Time) bool {
	s, _ := job["dispatch_at"].(string)
	d, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && !d.After(at)
}

// spacedAt checks that the tenant's next three arrivals from from on are
// at least T apart.
func spacedAt(t *testing.T, ds *downstreamtest.Server, what string, from time.Time, T time.Duration) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "three arrivals "+what, func() bool { return len(after(ds.Of("t0"), from)) >= 3 })
	got := after(ds.Of("t0"), from)[:3]
	t.Logf("%s: arrivals %v and %v apart (interval %v)", what, got[1].At.Sub(got[0].At).Round(time.Millisecond), got[2].At.Sub(got[1].At).Round(time.Millisecond), T)
	if v := downstreamtest.WindowViolation(got, T, 1); v != "" {
		t.Errorf("%s: not at one per %v: %s", what, T, v)
	}
}

// after is the arrivals at or after from.
func after(arrivals []downstreamtest.Arrival, from time.Time) []downstreamtest.Arrival {
	for i, a := range arrivals {
		if !a.At.Before(from) {
			return arrivals[i:]
		}
	}
	return nil
}

// pacedAt checks that the tenant's arrivals from from on come at interval
// T: the first within T and a scheduling margin of from, the next eight
// within eight intervals and the margin (at a slower pace they would take
// longer).
func pacedAt(t *testing.T, ds *downstreamtest.Server, what string, from time.Time, T time.Duration) {
	t.Helper()
	const n, margin = 9, 250 * time.Millisecond
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("%d arrivals %s", n, what), func() bool { return len(after(ds.Of("t0"), from)) >= n })
	got := after(ds.Of("t0"), from)[:n]
	first, span := got[0].At.Sub(from), got[n-1].At.Sub(got[0].At)
	t.Logf("%s: first arrival %v after, the next %d in %v (interval %v)", what, first.Round(time.Millisecond), n-1, span.Round(time.Millisecond), T)
	if first > T+margin || span > (n-1)*T+margin {
		t.Errorf("%s: first arrival %v after, the next %d in %v: not at one per %v", what, first, n-1, span, T)
	}
}
