package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"throttler/internal/downstreamtest"
	"throttler/internal/fakegateway"
	"throttler/internal/leaky"
	"throttler/internal/servicetest"
	"throttler/internal/testutil"
)

// SIGHUP with a new rate for a named tenant: sends are spaced by the new
// rate from then on; a broken config is refused with a log line and the
// running one kept.
func TestSighupReloadsTenantSettings(t *testing.T) {
	ds := downstreamtest.New(t)
	tenants := "[tenant_defaults]\ncapacity = 100\n[tenants.acme]\nrate = \"%s\"\n"
	file := servicetest.WriteConfig(t, fmt.Sprintf(tenants, "20/s"), ds.URL)
	original, _ := os.ReadFile(file)
	p := startProcess(t, file)

	enqueue := func(n int) []string {
		var ids []string
		for i := 0; i < n; i++ {
			st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":1}`)
			if st != 202 {
				t.Fatalf("%d %v", st, body)
			}
			ids = append(ids, body["id"].(string))
		}
		return ids
	}
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
	waitDelivered := func(ids []string) []downstreamtest.Arrival {
		testutil.WaitFor(t, 15*time.Second, "deliveries", func() bool { return len(arrivalsOf(ids)) == len(ids) })
		return arrivalsOf(ids)
	}
	hup := func(wantLog string) {
		before := strings.Count(p.logs(), wantLog)
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 5*time.Second, wantLog, func() bool { return strings.Count(p.logs(), wantLog) > before })
	}

	first := waitDelivered(enqueue(5))
	if !testutil.Race {
		downstreamtest.CheckWindows(t, first, 50*time.Millisecond, 1)
	}
	// Slower: 4/s.
	os.WriteFile(file, []byte(strings.Replace(string(original), `rate = "20/s"`, `rate = "4/s"`, 1)), 0o600)
	hup("config reloaded")
	if _, _, b := call(t, "GET", p.base+"/v1/tenants/acme", ""); b["rate_per_second"] != 4.0 {
		t.Fatalf("after reload: %v", b)
	}
	second := waitDelivered(enqueue(5))
	if !testutil.Race {
		downstreamtest.CheckWindows(t, second, 250*time.Millisecond, 1)
	}
	if span := second[4].At.Sub(second[0].At); span < 4*250*time.Millisecond-10*time.Millisecond {
		t.Fatalf("5 sends in %v at 4/s", span)
	}
	// A broken config is refused; the running one stays.
	os.WriteFile(file, []byte(strings.Replace(string(original), `rate = "20/s"`, `rate = "fast"`, 1)), 0o600)
	hup("config reload refused")
	if _, _, b := call(t, "GET", p.base+"/v1/tenants/acme", ""); b["rate_per_second"] != 4.0 {
		t.Fatalf("after a broken reload: %v", b)
	}
	third := waitDelivered(enqueue(3))
	if !testutil.Race {
		downstreamtest.CheckWindows(t, third, 250*time.Millisecond, 1)
	}
}

// On SIGTERM readiness turns false before the listener closes, then the
// process exits 0.
func TestReadinessFalseBeforeTheListenerCloses(t *testing.T) {
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
	for i := 0; i < 40; i++ {
		if st, _, b := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":1}`); st != 202 {
			t.Fatalf("%d %v", st, b)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "40 deliveries", func() bool { return gw.Accepted.Load()+gw.Refused.Load() >= 40 })
	if testutil.Race {
		return // timing is checked without -race
	}
	if n := gw.Refused.Load(); n != 0 {
		t.Fatalf("the gateway refused %d requests", n)
	}
}
