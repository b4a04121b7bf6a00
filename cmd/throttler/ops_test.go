package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/fakegateway"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/servicetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// reload writes config to the process's config file and sends it SIGHUP,
// then waits for wantLog to be logged once more.
func (p *process) reload(t *testing.T, file, config, wantLog string) {
	t.Helper()
	before := strings.Count(p.logs(), wantLog)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, wantLog, func() bool { return strings.Count(p.logs(), wantLog) > before })
}

// SIGHUP with a new rate for a named tenant: sends are spaced by the new
// rate from then on; a broken config is refused with a log line and the
// running one kept.
func TestSighupReloadsTenantSettings(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGHUP to the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	tenants := "[tenant_defaults]\ncapacity = 100\n[tenants.acme]\nrate = \"%s\"\n"
	file := servicetest.WriteConfig(t, fmt.Sprintf(tenants, "20/s"), ds.URL)
	original, _ := os.ReadFile(file)
	p := startProcess(t, file)

	arrivalsOf := func(ids []string) []downstreamtest.Arrival {
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		var out []downstreamtest.Arrival
		for _, a := range ds.All() {
			if want[a.Key] {
				out = append(out, a)
			}
		}
		return out
	}
	waitDelivered := func(n int) []downstreamtest.Arrival {
		ids := enqueueN(t, p.base, "acme", n)
		testutil.WaitFor(t, 15*time.Second, "deliveries", func() bool { return len(arrivalsOf(ids)) == len(ids) })
		return arrivalsOf(ids)
	}

	first := waitDelivered(5)
	downstreamtest.CheckWindows(t, first, 50*time.Millisecond, 1)
	for _, step := range []struct {
		rate, log string // the rate reloaded, and what the reload logs
		n         int    // jobs sent after it, one every 250 ms (4/s)
	}{
		{"4/s", "config reloaded", 5},
		{"fast", "config reload refused", 3}, // broken: the running one stays
	} {
		p.reload(t, file, strings.Replace(string(original), `rate = "20/s"`, `rate = "`+step.rate+`"`, 1), step.log)
		if _, _, b := call(t, "GET", p.base+"/v1/tenants/acme", ""); b["rate_per_second"] != 4.0 {
			t.Fatalf("after reloading %q: %v", step.rate, b)
		}
		sent := waitDelivered(step.n)
		downstreamtest.CheckWindows(t, sent, 250*time.Millisecond, 1)
		if span := sent[step.n-1].At.Sub(sent[0].At); span < time.Duration(step.n-1)*250*time.Millisecond-10*time.Millisecond {
			t.Fatalf("%d sends in %v at 4/s", step.n, span)
		}
	}
}

// On SIGTERM readiness turns false before the listener closes, then the
// process exits 0.
func TestReadinessFalseBeforeTheListenerCloses(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGTERM to the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	p := startProcess(t, servicetest.WriteConfigServer(t, `drain_delay = "1s"`, "", ds.URL))
	if st, _ := callRaw(t, "GET", p.base+"/readyz", ""); st != 200 {
		t.Fatalf("ready: %d", st)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sawNotReady := false
	testutil.WaitFor(t, 10*time.Second, "the listener closed", atMostEvery(20*time.Millisecond, func() bool {
		resp, err := httpClient.Get(p.base + "/readyz")
		if err != nil {
			return true // the listener closed
		}
		resp.Body.Close()
		if resp.StatusCode == 503 {
			sawNotReady = true
		} else if sawNotReady {
			t.Fatalf("ready again after not ready: %d", resp.StatusCode)
		}
		return false
	}))
	if !sawNotReady {
		t.Fatal("readiness never turned false before the listener closed")
	}
	<-p.done
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs())
	}
}

// A vendor that enforces its own limit (the fake gateway) never has to say
// 429 to a throttler set a little (5%) under that limit. The gateway judges
// arrivals by their kernel receive time (the recording downstream's), so the
// test process's own scheduling does not count against the throttler.
func TestFakeGatewayNeverRefuses(t *testing.T) {
	limit := leaky.MustParseRate("20/s")
	gw := fakegateway.New(&limit, 1, 200, nil)
	gw.ArrivedAt = downstreamtest.ArrivalTime
	ds := downstreamtest.New(t)
	ds.Answer(gw.ServeHTTP)
	base := startServer(t, servicetest.WriteConfig(t, "[tenant_defaults]\nrate = \"19/s\"\ncapacity = 100\n", ds.URL))
	enqueueN(t, base, "acme", 40)
	testutil.WaitFor(t, 15*time.Second, "40 deliveries", func() bool { return gw.Accepted.Load()+gw.Refused.Load() >= 40 })
	if testutil.Race {
		return // timing is checked without -race
	}
	if n := gw.Refused.Load(); n != 0 {
		t.Fatalf("the gateway refused %d requests", n)
	}
}

// A rate lowered by SIGHUP with a backlog waiting: 20/s with 18 jobs
// waiting, reloaded to 1/s, downstream timeout 1 s. The jobs scheduled at
// the old rate wait at the gate, the last ones for longer than 11 s (the
// timeout plus the 10 s that once bounded a whole attempt). Waiting there is
// never an attempt and never a failure: every job reaches the downstream
// once, on its first attempt, in order, one second apart once the new rate
// applies; nothing is retried, times out or opens the breaker.
func TestLoweredRateBacklogIsDeliveredAtTheNewPace(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGHUP to the throttler binary, then a backlog at 1/s")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	const n = 18
	ds := downstreamtest.New(t)
	file := servicetest.WriteConfig(t, "[tenant_defaults]\ncapacity = 100\n[tenants.acme]\nrate = \"20/s\"\n", ds.URL)
	raw, _ := os.ReadFile(file)
	config := strings.Replace(string(raw), `timeout = "2s"`, `timeout = "1s"`, 1)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, file)

	var ids []string
	var due []time.Time // each job's dispatch_at, as its 202 said
	for i := 0; i < n; i++ {
		st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != 202 {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		at, _ := time.Parse(time.RFC3339Nano, body["dispatch_at"].(string))
		ids, due = append(ids, body["id"].(string)), append(due, at)
	}
	p.reload(t, file, strings.Replace(config, `rate = "20/s"`, `rate = "1/s"`, 1), "config reloaded")
	// The jobs that may go at the old rate are those handed over before
	// the reload: due within the dispatcher's lead of it. How many that is
	// depends on how long the enqueues took (the race detector, a busy
	// machine), not on the code.
	reloaded := time.Now()
	oldRate := 0
	for _, at := range due {
		if !at.After(reloaded.Add(queue.DefaultLead)) {
			oldRate++
		}
	}

	// At most n seconds at the new rate, and a little more for the sends
	// that went at the old one; a job retried after a failure (backoff, the
	// breaker's cooldown) comes later than this.
	testutil.WaitFor(t, (n+2)*time.Second, "every job at the downstream", func() bool { return len(ds.All()) >= n })
	a := ds.All()
	for i, x := range a {
		if i >= len(ids) || x.Key != ids[i] || x.Attempt != "1" {
			t.Fatalf("arrival %d: job %s attempt %s; want every job once, first attempt, in order %v", i, x.Key, x.Attempt, ids)
		}
	}
	// The sends handed over before the reload went 50 ms apart; from the
	// first send at the new rate on, they are 1 s apart.
	first := 1
	for first < n && a[first].At.Sub(a[first-1].At) < 500*time.Millisecond {
		first++
	}
	// The first job handed over after the reload may follow the last one
	// before it by an old interval: that send moved the tenant's schedule
	// on by the old interval only. From it on, the new interval.
	if first > oldRate+1 {
		t.Fatalf("%d sends at the old rate, but only %d jobs were due within the lead (%v) of the reload", first, oldRate, queue.DefaultLead)
	}
	downstreamtest.CheckWindows(t, a[first-1:], time.Second, 1)
	// How long the sends at 1/s took in all is the machine's figure, not a
	// promise: each send is spaced from the real write of the one before
	// (invariant 1), so a busy machine's late timers add up along the
	// backlog (a cold build beside this test: 15 intervals in 16.03 s).
	// What would show a job retried or timed out is asserted above (every
	// arrival a first attempt) and in the metrics below.
	t.Logf("%d sends at 1/s took %v", n-first+1, a[n-1].At.Sub(a[first-1].At))
	// The last outcome is recorded a moment after its request arrives.
	delivered := `throttler_jobs_delivered_total{downstream="test",tenant="acme"}`
	var m string
	testutil.WaitFor(t, 5*time.Second, "the last outcome in the metrics", func() bool {
		m = scrape(t, p.base)
		return value(m, delivered) >= n
	})
	for series, want := range map[string]float64{
		`throttler_jobs_delivered_total{downstream="test",tenant="acme"}`:      n,
		`throttler_jobs_retried_total{downstream="test",tenant="acme"}`:        -1, // never counted: no series
		`throttler_attempts_total{class="2xx",downstream="test"}`:              n,
		`throttler_attempts_total{class="connection_error",downstream="test"}`: -1,
		`throttler_attempts_total{class="timeout",downstream="test"}`:          -1,
		`throttler_breaker_open{downstream="test"}`:                            0,
	} {
		if got := value(m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}
