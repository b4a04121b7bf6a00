package main

import (
	"fmt"
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

// A tenant's policy set by the API, while 100 of its jobs wait (admitted
// under pro, 10/s, set by the API; the file makes every tenant free,
// 2/s): pro outlives a kill -9 of every process (the backlog goes on at
// pro's pace, not free's), and on Redis the other worker, after a kill -9
// of the one sending, paces it at pro too; DELETE gives the file's rate
// back within a second in the process that sends (on Redis, a worker that
// took the DELETE from the API's process through Redis). Every job
// arrives, a repeat only with its key, and no two arrivals are closer than
// pro's interval.
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
	setPro := func() {
		t.Helper()
		if st, _, body := call(t, "PUT", api.base+"/v1/tenants/t0/policy", `{"plan":"pro"}`); st != 200 || body["plan"] != "pro" || body["plan_from"] != "api" {
			t.Fatalf("PUT pro: %d %v", st, body)
		}
	}
	setPro()
	names := postAtOnce(t, api.base, 1, 100) // tenant t0
	testutil.WaitFor(t, 10*time.Second, "five arrivals", func() bool { return len(ds.Of("t0")) >= 5 })

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

	if redisURL != "" { // the other worker, once the one sending is gone
		sending(t, senders).kill9(t)
		killed := time.Now()
		testutil.WaitFor(t, 10*time.Second, "an arrival after the kill", func() bool { return len(after(ds.Of("t0"), killed)) > 0 })
		pacedAt(t, ds, "after a kill -9 of the worker that sent it", after(ds.Of("t0"), killed)[0].At, pro)
		startProcess(t, file, role...)
	}
	testutil.WaitFor(t, 20*time.Second, "85 arrivals", func() bool { return len(ds.Of("t0")) >= 85 })
	dropped := time.Now()
	if st, _, body := call(t, "DELETE", api.base+"/v1/tenants/t0/policy", ""); st != 200 || body["plan"] != "free" || body["api"] != nil {
		t.Fatalf("DELETE: %d %v", st, body)
	}
	spacedAt(t, ds, "a second after the DELETE", dropped.Add(time.Second), free)

	all, repeats := awaitEveryKey(t, ds, names, pro)
	t.Logf("%d jobs, %d arrivals (%d repeats, each with its key) in %v", len(names), len(all), repeats, all[len(all)-1].At.Sub(all[0].At).Round(time.Millisecond))
	if repeats > 3 {
		t.Errorf("%d repeats: only attempts in flight at the kills may repeat", repeats)
	}
	downstreamtest.CheckWindows(t, all, pro, 1)
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
