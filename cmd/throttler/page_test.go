package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/servicetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

var (
	rowOf      = regexp.MustCompile(`(?s)<tr[^>]*data-tenant="([^"]+)"[^>]*>(.*?)</tr>`)
	depthOf    = regexp.MustCompile(`<td class="depth"[^>]*data-depth="(\d+)"`)
	sparkOfRow = regexp.MustCompile(`<svg class="spark[^"]*"[^>]*data-points="(\d+)"`)
)

// pageRows reads each row's depth and how many samples its chart drew.
func pageRows(dom string) (depths, points map[string]int) {
	depths, points = map[string]int{}, map[string]int{}
	for _, m := range rowOf.FindAllStringSubmatch(dom, -1) {
		if d := depthOf.FindStringSubmatch(m[2]); d != nil {
			depths[m[1]], _ = strconv.Atoi(d[1])
		}
		if p := sparkOfRow.FindStringSubmatch(m[2]); p != nil {
			points[m[1]], _ = strconv.Atoi(p[1])
		}
	}
	return depths, points
}

// batchOf puts n jobs (payloads from payload(i)) for tenant in one batch.
func batchOf(t *testing.T, base, tenant string, n int, payload func(i int) string, header ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"jobs":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"payload":%s}`, payload(i))
	}
	b.WriteString(`]}`)
	if st, _, body := call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs:batch", b.String(), header...); st != 200 {
		t.Fatalf("batch for %s: %d %v", tenant, st, body)
	}
}

func number(i int) string { return strconv.Itoa(i) }

// samples is how many samples the server keeps of tenant's last minutes.
func samples(t *testing.T, base, tenant string, header ...string) int {
	t.Helper()
	_, _, body := call(t, "GET", base+"/v1/history?tenant="+tenant, "", header...)
	h, _ := body["tenants"].(map[string]any)[tenant].(map[string]any)
	if h == nil {
		return 0
	}
	return len(h["t"].([]any))
}

// The status page in a real browser, with no auth: the numbers follow the
// queues, and each busy tenant's last minutes are drawn from the samples
// the server keeps.
func TestStatusPageInABrowser(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	bin := chromium(t)
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 100\n[tenants.alpha]\n", ds))
	batchOf(t, base, "alpha", 5, number) // one goes at once, four wait
	batchOf(t, base, "beta", 3, number)
	testutil.WaitFor(t, 10*time.Second, "two samples of alpha", atMostEvery(200*time.Millisecond, func() bool { return samples(t, base, "alpha") >= 2 }))
	dom := headless(t, bin, base+"/", "--dump-dom")
	depths, points := pageRows(dom)
	if depths["alpha"] != 4 || depths["beta"] != 2 || points["alpha"] < 2 {
		t.Fatalf("first look: depths %v, chart points %v\n%s", depths, points, dom)
	}
	batchOf(t, base, "alpha", 10, number)
	dom = headless(t, bin, base+"/", "--dump-dom")
	if depths, _ = pageRows(dom); depths["alpha"] != 14 {
		t.Fatalf("after 10 more: depths %v", depths)
	}
	if !strings.Contains(dom, `data-state="live"`) || !strings.Contains(dom, `data-downstream="test"`) {
		t.Fatalf("not live, or no downstream shown:\n%s", dom)
	}
	if !strings.Contains(dom, `data-limited-by="rate"`) || !strings.Contains(dom, `title="limited by its rate"`) {
		t.Fatalf("the tenants' waits (1/h) not shown as limited by their rate:\n%s", dom)
	}
}

// operatorConfig: two downstreams (sms with a ceiling of 10/s), three busy
// tenants and the tokens of security_test.go (admin, viewer).
func operatorConfig(t *testing.T, ds *downstreamtest.Server) string {
	return writeConfig(t, fmt.Sprintf(`
[downstreams.sms]
url = %q
timeout = "2s"
rate = "10/s"
max_in_flight = 50
rate_limit_headers = "ietf"
[tenants.alpha]
downstream = "sms"
rate = "4/s"
capacity = 400
[tenants.gamma]
downstream = "sms"
rate = "3/s"
capacity = 300
[tenants.beta]
downstream = "test"
rate = "1/s"
capacity = 200
`, ds.URL+"/send")+strings.Replace(tokensConfig(), "[tenant_defaults]\n", "[tenant_defaults]\ndownstream = \"test\"\n", 1), ds)
}

// gateway answers like an SMS vendor: 400 for a payload that asks to
// fail, now and then a 429 with Retry-After for alpha, else 200.
func gateway(ds *downstreamtest.Server) {
	var n atomic.Int64
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case bytes.Contains(body, []byte(`"fail"`)):
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid_number","message":"+1555000 is not a mobile number"}`)
		case r.Header.Get("X-Throttler-Tenant") == "alpha" && n.Add(1)%15 == 0:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
}

// busy starts the operator's workload and waits until beta has failed
// jobs and the server has kept some history; it returns beta's failed jobs.
func busy(t *testing.T, base string) []string {
	t.Helper()
	admin := bearer(tokAdmin)
	batchOf(t, base, "alpha", 200, number, admin...)
	batchOf(t, base, "gamma", 150, number, admin...)
	batchOf(t, base, "beta", 104, func(i int) string {
		if i < 4 {
			return `{"fail":true,"to":"+1555000"}`
		}
		return number(i)
	}, admin...)
	for i := 1; i <= 30; i++ {
		batchOf(t, base, fmt.Sprintf("shop-%02d", i), 1+i%17, number, admin...)
	}
	var failed []string
	testutil.WaitFor(t, 20*time.Second, "beta's 4 failed jobs", atMostEvery(200*time.Millisecond, func() bool {
		_, _, body := call(t, "GET", base+"/v1/tenants/beta/jobs?state=failed", "", admin...)
		jobs, _ := body["jobs"].([]any)
		failed = failed[:0]
		for _, j := range jobs {
			failed = append(failed, j.(map[string]any)["id"].(string))
		}
		return len(failed) == 4
	}))
	testutil.WaitFor(t, 30*time.Second, "12 s of samples", atMostEvery(500*time.Millisecond, func() bool { return samples(t, base, "alpha", admin...) >= 7 }))
	return failed
}

// The page an operator keeps open: screenshots at laptop and phone widths
// (artefacts), and its buttons, each one's effect checked through the API:
// a scoped token sees its tenant alone; a viewer sees no button; an admin
// looks up a failed job, retries it (it is queued again), pauses beta
// (held) and resumes it (not held).
func TestStatusPageOperator(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	bin := chromium(t)
	ds := downstreamtest.New(t)
	gateway(ds)
	base := startServer(t, operatorConfig(t, ds))
	failed := busy(t, base)
	admin := bearer(tokAdmin)
	if st, _, body := call(t, "PUT", base+"/v1/tenants/beta/policy", `{"capacity":250}`, admin...); st != 200 {
		t.Fatalf("PUT beta's policy: %d %v", st, body)
	}
	// Two jobs of beta booked for tomorrow: beside its depth, apart.
	tomorrow := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	for i := range 2 {
		if st, _, body := call(t, "POST", base+"/v1/tenants/beta/jobs", fmt.Sprintf(`{"payload":{"later":%d},"not_before":%q}`, i, tomorrow), admin...); st != 202 || body["state"] != "scheduled" {
			t.Fatalf("a job of beta for tomorrow: %d %v", st, body)
		}
	}

	look := []map[string]any{{"do": "token", "value": tokAdmin, "role": "admin"}, {"do": "select", "tenant": "beta"}, {"do": "wait", "ms": 2500}}
	shots := pageProxy(t, base, look, nil)
	screenshot(t, bin, shots+"/", "status-laptop.png", 1366, 900, 8*time.Second)
	screenshot(t, bin, shots+"/", "status-phone.png", 390, 844, 8*time.Second)

	job := failed[0]
	plan := []map[string]any{
		// A token scoped to tenant a sees a alone, and no downstream.
		{"do": "token", "value": tokProducerA, "role": "producer"},
		{"do": "present", "sel": `#rows tr[data-tenant="a"]`},
		{"do": "absent", "sel": `#rows tr[data-tenant="beta"], #downstreams .ds`},
		{"do": "token", "value": tokViewer, "role": "viewer"},
		{"do": "select", "tenant": "beta"},
		{"do": "present", "sel": `#failed tr[data-job="` + job + `"]`},
		{"do": "absent", "sel": "#pauseBtn, #resumeBtn, #failed button.retry"},
		{"do": "token", "value": tokAdmin, "role": "admin"},
		// The downstream's cap on attempts in flight and the rate limit
		// fields it reads; the one with neither shows no such line.
		{"do": "present", "sel": `#downstreams .ds[data-downstream="sms"] .announced[data-holds="0"]`},
		{"do": "absent", "sel": `#downstreams .ds[data-downstream="test"] .announced`},
		{"do": "select", "tenant": "beta"},
		// Where beta's policy comes from: its capacity set by the API, its
		// rate the file's.
		{"do": "present", "sel": `#policy[data-set="api"] .key[data-key="capacity"][data-from="api"]`},
		{"do": "present", "sel": `#policy .key[data-key="rate"][data-from="file"]`},
		{"do": "present", "sel": `#rows tr[data-tenant="beta"] td.depth .sched[data-scheduled="2"]`},
		{"do": "lookup", "job": job, "expect": "400 Bad Request"},
		{"do": "retry", "job": job},
		{"do": "pause", "tenant": "beta"},
		{"do": "resume", "tenant": "beta"},
	}
	check := func(name string, data map[string]any) string {
		switch name {
		case "retried":
			_, _, j := call(t, "GET", base+"/v1/jobs/"+job, "", admin...)
			if j["state"] != "queued" {
				return fmt.Sprintf("job %s after retry: %v, want queued", job, j)
			}
		case "paused", "resumed":
			_, _, st := call(t, "GET", base+"/v1/tenants/beta", "", admin...)
			if want := name == "paused"; st["held"] != want || st["paused"] != want {
				return fmt.Sprintf("beta after %s: held %v, paused %v", name, st["held"], st["paused"])
			}
		}
		return ""
	}
	dom := headlessFor(t, bin, pageProxy(t, base, plan, check)+"/", 30*time.Second, "--dump-dom")
	t.Logf("driver:\n%s", driven(t, dom))
}

// With thousands of busy tenants the page shows 50 at a time, deepest
// first, and pages through them.
func TestStatusPageThousandsOfTenants(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	bin := chromium(t)
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 100\n", ds))
	for i := 1; i <= 2000; i++ {
		n := 2
		if i <= 80 {
			n = 2 + i // deep-001 waits 2 jobs ... deep-080 waits 81
		}
		name := fmt.Sprintf("deep-%03d", i)
		if i > 80 {
			name = fmt.Sprintf("t-%04d", i)
		}
		batchOf(t, base, name, n, number)
	}
	pages := map[string][]any{}
	check := func(name string, data map[string]any) string {
		rows, _ := data["rows"].([]any)
		pages[name] = rows
		return ""
	}
	plan := []map[string]any{
		{"do": "live"}, {"do": "rows", "name": "first"},
		{"do": "page", "dir": "next", "expect": "51–100"}, {"do": "rows", "name": "second"},
		{"do": "page", "dir": "prev", "expect": "1–50"},
	}
	dom := headlessFor(t, bin, pageProxy(t, base, plan, check)+"/", 20*time.Second, "--dump-dom")
	driven(t, dom)
	var all []int
	for _, p := range []string{"first", "second"} {
		if len(pages[p]) != 50 {
			t.Fatalf("%s page: %d rows, want 50: %v", p, len(pages[p]), pages[p])
		}
		for _, r := range pages[p] {
			all = append(all, int(r.(map[string]any)["depth"].(float64)))
		}
	}
	first := pages["first"][0].(map[string]any)
	if first["tenant"] != "deep-080" || all[0] != 81 || all[79] != 2 || all[99] != 1 {
		t.Fatalf("first row %v; depths %v", first, all)
	}
	for i := 1; i < len(all); i++ {
		if all[i] > all[i-1] {
			t.Fatalf("not deepest first at row %d: %v", i+1, all)
		}
	}
}

// The page says when the server is unreachable, and keeps the last numbers
// it had (greyed out).
func TestStatusPageSaysServerUnreachable(t *testing.T) {
	testutil.SkipShort(t, "browser test: headless Chromium")
	bin := chromium(t)
	ds := downstreamtest.New(t)
	base, stop := servicetest.StartStoppable(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 100\n", ds))
	batchOf(t, base, "alpha", 5, number)
	plan := []map[string]any{{"do": "live"}, {"do": "report", "name": "stop"}, {"do": "unreachable"}}
	check := func(name string, _ map[string]any) string {
		stop()
		if st, err := http.Get(base + "/healthz"); err == nil {
			st.Body.Close()
			return "the server still answers"
		}
		return ""
	}
	dom := headlessFor(t, bin, pageProxy(t, base, plan, check)+"/", 20*time.Second, "--dump-dom")
	log := driven(t, dom)
	if !strings.Contains(log, "banner: Server unreachable since") || !strings.Contains(dom, `data-stale="1"`) {
		t.Fatalf("driver: %s\n%s", log, dom)
	}
	if depths, _ := pageRows(dom); depths["alpha"] != 4 {
		t.Fatalf("the last numbers are gone: %v", depths)
	}
}
