package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/servicetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func TestMain(m *testing.M) {
	code := func() int {
		defer func() {
			if binDir != "" {
				os.RemoveAll(binDir)
			}
		}()
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("internal/poll.runtime_pollWait")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// exchange is one request from the client as the server side saw it.
type exchange struct {
	path       string
	start, end time.Time
	statuses   []int
	retryAfter time.Duration // the longest retry_after_ms among refused jobs
}

// proxy sits between the client and the API and records every exchange.
type proxy struct {
	*httptest.Server
	mu  sync.Mutex
	log []exchange
}

// newProxy is a proxy to api; with stripRateLimit it drops the RateLimit
// fields from answers, as a server that does not send them would.
func newProxy(t *testing.T, api string, stripRateLimit bool) *proxy {
	t.Helper()
	target, _ := url.Parse(api)
	p := &proxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if stripRateLimit {
			resp.Header.Del("RateLimit-Policy")
			resp.Header.Del("RateLimit")
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var out struct {
			Results []struct {
				Status       int   `json:"status"`
				RetryAfterMS int64 `json:"retry_after_ms"`
			} `json:"results"`
		}
		if resp.Request.Method == http.MethodPost && json.Unmarshal(body, &out) == nil {
			ex := exchange{path: resp.Request.URL.Path, start: resp.Request.Context().Value(startKey{}).(time.Time), end: time.Now()}
			for _, r := range out.Results {
				ex.statuses = append(ex.statuses, r.Status)
				if r.Status == 429 {
					ex.retryAfter = max(ex.retryAfter, time.Duration(r.RetryAfterMS)*time.Millisecond)
				}
			}
			p.mu.Lock()
			p.log = append(p.log, ex)
			p.mu.Unlock()
		}
		return nil
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), startKey{}, time.Now())))
	}))
	t.Cleanup(p.Close)
	return p
}

type startKey struct{}

func (p *proxy) exchanges() []exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exchange(nil), p.log...)
}

func (p *proxy) count(status int) int { return p.countFor("", status) }

// countFor counts the jobs of tenant ("": any) answered status.
func (p *proxy) countFor(tenant string, status int) int {
	n := 0
	for _, ex := range p.exchanges() {
		if tenant != "" && ex.path != "/v1/tenants/"+tenant+"/jobs:batch" {
			continue
		}
		for _, s := range ex.statuses {
			if s == status {
				n++
			}
		}
	}
	return n
}

// setup runs a throttler with the given tenant settings, a recording
// downstream and a recording proxy in front of the API.
func setup(t *testing.T, tenantDefaults string) (*downstreamtest.Server, *proxy) {
	t.Helper()
	return setupProxy(t, tenantDefaults, false)
}

// setupProxy is setup with the proxy's stripRateLimit.
func setupProxy(t *testing.T, tenantDefaults string, stripRateLimit bool) (*downstreamtest.Server, *proxy) {
	t.Helper()
	ds := downstreamtest.New(t)
	api := servicetest.Start(t, servicetest.WriteConfig(t, tenantDefaults, ds.URL+"/send"))
	return ds, newProxy(t, api, stripRateLimit)
}

func writeLines(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "{\"to\":\"+1555%07d\",\"text\":\"message %d\"}\n", i, i)
	}
	p := filepath.Join(t.TempDir(), "jobs.ndjson")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runEnqueue runs the command in-process and returns its exit status.
func runEnqueue(ctx context.Context, t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newCommand(strings.NewReader(stdin), &out, &errOut, nil)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	code := 0
	var ee exitError
	if errors.As(err, &ee) {
		code = ee.code
	} else if err != nil {
		code = -1
	}
	return code, out.String(), errOut.String()
}

// nothingMoreWithin lets d pass so that the checks after it can show that
// nothing more happened meanwhile (no repeat delivery): absence has no
// condition to wait for.
func nothingMoreWithin(d time.Duration) { time.Sleep(d) }

// deliveredOnce waits until the downstream has seen n distinct jobs and
// checks none twice.
func deliveredOnce(t *testing.T, ds *downstreamtest.Server, n int) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("%d deliveries", n), func() bool { return len(ds.Keys()) >= n })
	nothingMoreWithin(200 * time.Millisecond) // a repeat would come now
	keys := ds.Keys()
	if len(keys) != n {
		t.Fatalf("%d distinct jobs delivered, want %d", len(keys), n)
	}
	for k, c := range keys {
		if c != 1 {
			t.Fatalf("job %s delivered %d times", k, c)
		}
	}
}

// An import of 100 lines into a tenant at 20/s with room for 5, from a
// server whose answers lack the RateLimit fields (so that enqueue cannot
// pace itself and is told 429): every line accepted and delivered, and no
// request from the client arrives before the Retry-After it was given
// (less 50 ms).
func TestImportHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	ds, px := setupProxy(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 5\n", true)
	code, out, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--file", writeLines(t, 100), "--progress", "none")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "100 accepted") {
		t.Fatalf("summary: %s", out)
	}
	ex := px.exchanges()
	if px.count(429) == 0 {
		t.Fatal("the server never said 429: the test shows nothing")
	}
	for i := 1; i < len(ex); i++ {
		if ra := ex[i-1].retryAfter; ra > 0 {
			if early := ex[i-1].end.Add(ra - 50*time.Millisecond).Sub(ex[i].start); early > 0 {
				t.Fatalf("request %d came %v before the Retry-After (%v) it was given", i, early, ra)
			}
		}
	}
	deliveredOnce(t, ds, 100)
}

// Interrupted after half the lines, then run again: each line is delivered
// exactly once.
func TestInterruptedImportRerunSendsEachLineOnce(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, "[tenant_defaults]\nrate = \"50/s\"\ncapacity = 10\n")
	file := writeLines(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runEnqueue(ctx, t, "", "--server", px.URL, "--tenant", "acme", "--file", file, "--progress", "none", "--batch", "5")
		done <- result{code, out, errOut}
	}()
	testutil.WaitFor(t, 30*time.Second, "half the lines accepted", func() bool { return px.count(202) >= 50 })
	cancel()
	r := <-done
	code, out, errOut := r.code, r.out, r.err
	if code != exitInterrupted || !strings.Contains(errOut, "run the same command again") {
		t.Fatalf("interrupted run: exit %d\n%s%s", code, out, errOut)
	}
	first := px.count(202)
	if first >= 100 {
		t.Fatalf("the first run was not interrupted (%d accepted)", first)
	}
	code, out, errOut = runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--file", file, "--progress", "none", "--json")
	if code != 0 {
		t.Fatalf("second run: exit %d\n%s%s", code, out, errOut)
	}
	var s summary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("--json: %v: %s", err, out)
	}
	if s.Accepted != 100 || s.Duplicates < first {
		t.Fatalf("second run %+v after %d accepted by the first", s, first)
	}
	deliveredOnce(t, ds, 100)
}

// Pacing itself just under the tenant's rate, the client is never told 429.
func TestRateJustUnderNeverRefused(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 5\n")
	code, out, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--file", writeLines(t, 40), "--rate", "19/s", "--progress", "lines")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if n := px.count(429); n != 0 {
		t.Fatalf("%d refusals with --rate just under the tenant's", n)
	}
	if px.count(202) != 40 {
		t.Fatalf("%d accepted", px.count(202))
	}
	if !strings.Contains(errOut, "accepted 40/40") {
		t.Fatalf("progress lines: %q", errOut)
	}
	deliveredOnce(t, ds, 40)
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, "[tenant_defaults]\nmode = \"token\"\nrate = \"1/h\"\nburst = 1\nallow_unknown_tenants = false\n[tenants.acme]\n[tenants.bad]\n")
	bad := filepath.Join(t.TempDir(), "bad.ndjson")
	os.WriteFile(bad, []byte("{\"ok\":1}\n{not json\n"), 0o600)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Throttler-Tenant") == "bad" {
			http.Error(w, "invalid number", http.StatusBadRequest)
			return
		}
		w.WriteHeader(200)
	})
	cases := []struct {
		name string
		code int
		says string
		args []string
	}{
		{"all accepted", exitOK, "", []string{"--tenant", "acme", "--data", `{"a":1}`}},
		{"server unreachable", exitUnreachable, "unreachable", []string{"--server", "http://127.0.0.1:1", "--tenant", "acme", "--data", "1", "--max-attempts", "2"}},
		{"bad file", exitBadInput, "bad.ndjson:2: not valid JSON", []string{"--tenant", "acme", "--file", bad}},
		{"missing file", exitBadInput, "no such file", []string{"--tenant", "acme", "--file", "/nonexistent/x"}},
		{"bad rate", exitBadInput, "--rate", []string{"--tenant", "acme", "--data", "1", "--rate", "fast"}},
		{"refused after max attempts", exitRejected, "still refused after 1 attempts", []string{"--tenant", "acme", "--file", writeLines(t, 3), "--max-attempts", "1"}},
		{"unknown tenant", exitRefused, "unknown_tenant", []string{"--tenant", "stranger", "--data", "1"}},
		{"not delivered", exitNotDelivered, "not delivered", []string{"--tenant", "bad", "--data", "1", "--wait"}},
	}
	for _, c := range cases {
		args := append([]string{"--server", px.URL, "--progress", "none"}, c.args...)
		code, out, errOut := runEnqueue(context.Background(), t, "", args...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", c.name, code, c.code, out, errOut)
			continue
		}
		lines := strings.Count(errOut, "enqueue:")
		if c.code != 0 && (lines != 1 || !strings.Contains(errOut, c.says)) {
			t.Errorf("%s: want one message mentioning %q, got %q", c.name, c.says, errOut)
		}
		if c.code == 0 && errOut != "" {
			t.Errorf("%s: stderr %q", c.name, errOut)
		}
	}
}

func TestStdinAndWait(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, "[tenant_defaults]\nrate = \"100/s\"\ncapacity = 50\n")
	code, out, errOut := runEnqueue(context.Background(), t, "1\n\n\"two\"\n{\"three\":3}\n", "--server", px.URL, "--tenant", "acme", "--file", "-", "--wait", "--progress", "none")
	if code != 0 || !strings.Contains(out, "3 accepted") || !strings.Contains(out, "3 delivered") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	deliveredOnce(t, ds, 3)
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// The command as users run it, from the built binary, once.
func TestBinary(t *testing.T) {
	testutil.SkipShort(t, "process test: builds the enqueue binary")
	t.Parallel()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "enqueue-bin-")
		if buildErr == nil {
			binPath = filepath.Join(binDir, "enqueue")
			if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	ds, px := setup(t, "[tenant_defaults]\nrate = \"100/s\"\n")
	cmd := exec.Command(binPath, "--tenant", "acme", "--file", writeLines(t, 5), "--wait")
	cmd.Env = append(os.Environ(), "THROTTLER_SERVER="+px.URL)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "5 accepted") || !strings.Contains(string(out), "5 delivered") {
		t.Fatalf("%v\n%s", err, out)
	}
	deliveredOnce(t, ds, 5)
	bad := exec.Command(binPath, "--tenant", "acme", "--data", "{")
	bad.Env = cmd.Env
	out, err = bad.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitBadInput {
		t.Fatalf("bad --data: %v\n%s", err, out)
	}
}

// --cost and --expires-in go with every job; a job that cannot make its
// deadline is refused at once, not retried.
func TestCostAndExpiry(t *testing.T) {
	t.Parallel()
	_, px := setup(t, "[tenant_defaults]\nrate = \"2/s\"\ncapacity = 10\n")
	code, out, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--data", `{"n":1}`, "--cost", "3", "--expires-in", "10m", "--json", "--progress", "none")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	var sum struct{ IDs []string }
	json.Unmarshal([]byte(out), &sum)
	st, body := getJSON(t, px.URL+"/v1/jobs/"+sum.IDs[0])
	if st != 200 || body["cost"] != 3.0 || body["deadline"] == nil {
		t.Fatalf("job %d %v", st, body)
	}
	// The cost-3 job holds the next 1.5 s: a job due within 1 s cannot go.
	code, out, errOut = runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--data", `{"n":2}`, "--expires-in", "1s", "--progress", "none")
	if code != exitRejected || !strings.Contains(errOut, "refused for good") {
		t.Fatalf("a job that would expire: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", "acme", "--data", "1", "--cost", "-1"); code != exitBadInput {
		t.Fatalf("--cost -1: exit %d %s", code, errOut)
	}
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}
