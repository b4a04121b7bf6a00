package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// redisConfig writes a config for processes sharing the Redis at url.
func redisConfig(t *testing.T, url, mode, body string, ds *downstreamtest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	full := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n[store]\nbackend = \"redis\"\nredis_url = %q\nredis_mode = %q\nredis_lease = \"1s\"\n[downstreams.test]\nurl = %q\ntimeout = \"2s\"\n%s",
		url, mode, ds.URL+"/send", body)
	if err := os.WriteFile(p, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Three processes on one Redis, every one an API and a dispatcher.
func TestThreeProcessesShareOneRedis(t *testing.T) {
	testutil.SkipShort(t, "process test: three throttler processes on one redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	sharedBurst(t, srv.URL(), "standalone", "all", "all", "all")
}

// One API-only process and two workers.
func TestAPIAndTwoWorkersShareOneRedis(t *testing.T) {
	testutil.SkipShort(t, "process test: throttler processes on one redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	sharedBurst(t, srv.URL(), "standalone", "api", "worker", "worker")
}

// sharedBurst starts a process per role on one Redis, sends 200 jobs of one
// tenant (10/s, capacity 50) through every API at once, round robin, and
// checks what DESIGN.md promises across processes: exactly capacity + 1
// accepted, each delivered once, and the window rule at the downstream.
func sharedBurst(t *testing.T, url, mode string, roles ...string) {
	ds := downstreamtest.New(t)
	file := redisConfig(t, url, mode, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds)
	const T = 100 * time.Millisecond
	var apis, all []string
	for _, role := range roles {
		p := startProcess(t, file, "--role", role)
		all = append(all, p.base)
		if role == "worker" {
			if st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":{}}`); st != http.StatusNotFound || body["error"] != "worker_only" {
				t.Fatalf("a worker's API answered %d %v", st, body)
			}
			continue
		}
		apis = append(apis, p.base)
	}

	answers, began := burst(t, apis, 200)
	last := began
	accepted := map[string]bool{}
	for _, a := range answers {
		last = clock.Later(last, a.at)
		switch a.status {
		case http.StatusAccepted:
			accepted[a.body["id"].(string)] = true
		case http.StatusTooManyRequests:
			if a.body["error"] != "queue_full" || a.header.Get("Retry-After") == "" {
				t.Fatalf("rejection %v %v", a.header, a.body)
			}
		default:
			t.Fatalf("status %d: %v", a.status, a.body)
		}
	}
	span := last.Sub(began)
	t.Logf("200 decisions through %d APIs in %v", len(apis), span)
	// Capacity 50 and one going at once; a burst that takes longer than an
	// interval (the race detector slows every process down) also finds the
	// places freed meanwhile, one an interval, and no more.
	if most := 51 + int(span/T); len(accepted) < 51 || len(accepted) > most {
		t.Fatalf("accepted %d, want 51 (capacity 50 and one going at once), or at most %d for a burst that took %v", len(accepted), most, span)
	}
	n := len(accepted)

	testutil.WaitFor(t, 20*time.Second, "every accepted job delivered", func() bool { return len(ds.All()) >= n })
	nothingMoreWithin(3 * T) // no repeat, no job that was not accepted
	got := ds.All()
	seen := map[string]bool{}
	for _, a := range got {
		if !accepted[a.Key] {
			t.Fatalf("delivered %q, which was not accepted", a.Key)
		}
		if seen[a.Key] {
			t.Fatalf("%q delivered twice", a.Key)
		}
		seen[a.Key] = true
	}
	if len(got) != n {
		t.Fatalf("downstream saw %d requests, want %d", len(got), n)
	}
	downstreamtest.CheckWindows(t, got, T, 1)
	everyPartitionHeldOnce(t, all)
}

// redisOnlyMetrics are the families only a process on Redis exports
// (queue.Ownership): the tests on the embedded store take them as checked
// here.
var redisOnlyMetrics = []string{"throttler_redis_partitions_held", "throttler_redis_partitions"}

// everyPartitionHeldOnce checks what /metrics says of the partitions: each
// process exports P (the operations page's metrics table names both), and the
// partitions the processes hold add up to P, as an alert on their sum
// (deploy/alerts.yml) expects of a healthy deployment.
func everyPartitionHeldOnce(t *testing.T, processes []string) {
	t.Helper()
	ops := string(repoFile(t, "docs/operations.md"))
	for _, name := range redisOnlyMetrics {
		if !strings.Contains(ops, "| `"+name+"` |") {
			t.Errorf("docs/operations.md's metrics table lacks %s", name)
		}
		if m := scrape(t, processes[0]); !strings.Contains(m, "# TYPE "+name+" ") {
			t.Errorf("a Redis process does not export %s", name)
		}
	}
	const P = 32 // store.redis_partitions' default
	var held []float64
	testutil.WaitFor(t, 10*time.Second, "the processes' held partitions to add up to P", func() bool {
		var got []float64
		sum := 0.0
		for _, base := range processes {
			m := scrape(t, base)
			if p := value(m, "throttler_redis_partitions"); p != P {
				t.Fatalf("%s exports throttler_redis_partitions %v, want %d", base, p, P)
			}
			h := value(m, "throttler_redis_partitions_held")
			got = append(got, h)
			sum += h
		}
		held = got
		return sum == P
	})
	t.Logf("partitions held by each process: %v", held)
}

// kill -9 of a worker mid-attempt, and of another while jobs wait: every
// accepted job is still delivered, and a job repeats only with the same
// Idempotency-Key (a downstream that dedupes carries each out once).
func TestKill9OfWorkersOnRedisLosesNothing(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 of throttler workers on Redis")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	ds := downstreamtest.New(t)
	inAttempt, carriedOut := stallThirdJob(t, ds)
	file := redisConfig(t, srv.URL(), "standalone", "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds)
	api := startProcess(t, file, "--role", "api")
	w1 := startProcess(t, file, "--role", "worker")
	ids := enqueueN(t, api.base, "acme", 30)
	crashed := awaitStalled(t, inAttempt)
	w1.kill9(t) // mid-attempt, with jobs claimed and waiting in it
	killed := time.Now()
	w2 := startProcess(t, file, "--role", "worker")
	startProcess(t, file, "--role", "worker")
	testutil.WaitFor(t, 20*time.Second, "deliveries by the new workers", func() bool { return len(ds.All()) >= 10 })
	w2.kill9(t) // while jobs wait

	waitAllSucceeded(t, api.base, ids, 60*time.Second)
	all := ds.All()
	var back time.Duration
	for _, a := range all {
		if a.Key == crashed && a.At.After(killed) {
			back = a.At.Sub(killed)
		}
	}
	accepted := map[string]bool{}
	for _, id := range ids {
		accepted[id] = true
	}
	repeats := 0
	for key, n := range ds.Keys() {
		if !accepted[key] {
			t.Fatalf("delivered Idempotency-Key %q that was never accepted", key)
		}
		repeats += n - 1
	}
	t.Logf("the job in flight at the crash was sent again %v after it; %d repeats in all (same Idempotency-Key)", back.Round(time.Millisecond), repeats)
	if ds.Keys()[crashed] < 2 {
		t.Fatalf("the job in flight at the crash arrived %d times, want again after the crash", ds.Keys()[crashed])
	}
	if repeats > 4 {
		t.Fatalf("%d repeats: only attempts in flight at a kill may repeat", repeats)
	}
	checkCarriedOutOnce(t, carriedOut(), ids)
	downstreamtest.CheckWindows(t, all, 100*time.Millisecond, 1)
}

// Redis restarted (AOF on) while jobs wait: the API answers 503 with
// Retry-After while it is down and /readyz fails, no process exits, and once
// it is back every job accepted before is delivered, paced, with no burst.
func TestRedisRestartLosesNothing(t *testing.T) {
	testutil.SkipShort(t, "process test: throttler processes across a restart of their redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, true)
	ds := downstreamtest.New(t)
	file := redisConfig(t, srv.URL(), "standalone", "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds)
	procs := []*process{startProcess(t, file), startProcess(t, file, "--role", "worker")}
	base := procs[0].base
	var ids []string
	for i := 0; i < 30; i++ {
		st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != http.StatusAccepted {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		ids = append(ids, body["id"].(string))
	}
	testutil.WaitFor(t, 10*time.Second, "some deliveries", func() bool { return len(ds.All()) >= 5 })
	srv.Kill()
	st, h, body := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":{"n":99}}`)
	if st != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Fatalf("enqueue with Redis down: %d %v %v", st, h, body)
	}
	for _, p := range procs {
		if st, _, body := call(t, "GET", p.base+"/readyz", ""); st != http.StatusServiceUnavailable {
			t.Fatalf("/readyz with Redis down: %d %v", st, body)
		}
	}
	nothingMoreWithin(time.Second) // down a while: workers try and fail, and none may exit
	for _, p := range procs {
		select {
		case <-p.done:
			t.Fatalf("a process exited while Redis was down:\n%s", p.logs())
		default:
		}
	}
	srv.Restart()
	testutil.WaitFor(t, 30*time.Second, "every job accepted before delivered", func() bool { return allSucceeded(t, base, ids) })
	if st, _, body := call(t, "GET", base+"/readyz", ""); st != http.StatusOK {
		t.Fatalf("/readyz after Redis came back: %d %v", st, body)
	}
	all := ds.All()
	var gap time.Duration
	for i := 1; i < len(all); i++ {
		gap = max(gap, all[i].At.Sub(all[i-1].At))
	}
	t.Logf("%d arrivals; the longest gap between two (the outage in it) %v", len(all), gap.Round(time.Millisecond))
	for key, n := range ds.Keys() {
		if n > 2 {
			t.Fatalf("%s arrived %d times", key, n)
		}
	}
	downstreamtest.CheckWindows(t, all, 100*time.Millisecond, 1)
}

// The same burst on a Redis Cluster of three masters.
func TestThreeProcessesShareOneRedisCluster(t *testing.T) {
	testutil.SkipShort(t, "process test: three throttler processes on a Redis Cluster")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	c := redistest.StartCluster(t, 3)
	sharedBurst(t, c.URL(), "cluster", "all", "all", "all")
}
