package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/servicetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

const (
	tokProducerA = "thr_producer_for_a_only_0123456789"
	tokViewer    = "thr_viewer_of_everything_012345678"
	tokAdmin     = "thr_admin_of_everything_0123456789"
)

func tokensConfig() string {
	return `
[tenant_defaults]
rate = "1/h"
capacity = 100
` + testutil.AuthTokens(
		testutil.Token{Name: "producer-a", Secret: tokProducerA, Role: "producer", Tenants: []string{"a"}},
		testutil.Token{Name: "viewer", Secret: tokViewer, Role: "viewer", Tenants: []string{"*"}},
		testutil.Token{Name: "admin", Secret: tokAdmin, Role: "admin", Tenants: []string{"*"}},
	)
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// A producer token for tenant a cannot touch tenant b, and learns nothing of
// it: b's job answers exactly like a job that does not exist.
func TestTokensScopeAndRoles(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, tokensConfig(), ds))
	// Two jobs for b, so that b's queue has one waiting.
	var jobB string
	for i := 0; i < 2; i++ {
		st, _, body := call(t, "POST", base+"/v1/tenants/b/jobs", `{"payload":{"secret":"+15550199"}}`, bearer(tokAdmin)...)
		if st != 202 {
			t.Fatalf("admin enqueue to b: %d %v", st, body)
		}
		jobB = body["id"].(string)
	}
	unknown := "0000000000000000000000000a"

	p := bearer(tokProducerA)
	cases := []struct {
		name, method, path, body string
		header                   []string
		status                   int
	}{
		{"producer enqueues to its tenant", "POST", "/v1/tenants/a/jobs", `{"payload":1}`, p, 202},
		{"producer enqueues to b", "POST", "/v1/tenants/b/jobs", `{"payload":1}`, p, 403},
		{"producer batch to b", "POST", "/v1/tenants/b/jobs:batch", `{"jobs":[{"payload":1}]}`, p, 403},
		{"producer reads b", "GET", "/v1/tenants/b", ``, p, 403},
		{"producer lists all tenants", "GET", "/v1/tenants", ``, p, 403},
		{"viewer enqueues", "POST", "/v1/tenants/a/jobs", `{"payload":1}`, bearer(tokViewer), 403},
		{"viewer cancels", "DELETE", "/v1/jobs/" + jobB, ``, bearer(tokViewer), 403},
		{"viewer reads", "GET", "/v1/tenants/b", ``, bearer(tokViewer), 200},
		{"producer pauses its own tenant", "POST", "/v1/tenants/a/pause", ``, p, 403},
		{"viewer pauses", "POST", "/v1/tenants/b/pause", ``, bearer(tokViewer), 403},
		{"admin pauses", "POST", "/v1/tenants/b/pause", ``, bearer(tokAdmin), 200},
		{"admin resumes", "POST", "/v1/tenants/b/resume", ``, bearer(tokAdmin), 200},
		{"pause without a token", "POST", "/v1/tenants/b/pause", ``, nil, 401},
		{"viewer lists", "GET", "/v1/tenants", ``, bearer(tokViewer), 200},
		{"producer lists b's failed jobs", "GET", "/v1/tenants/b/jobs?state=failed", ``, p, 403},
		{"producer lists its failed jobs", "GET", "/v1/tenants/a/jobs?state=failed", ``, p, 200},
		{"viewer retries", "POST", "/v1/jobs/" + jobB + "/retry", ``, bearer(tokViewer), 403},
		{"producer reads metrics", "GET", "/metrics", ``, p, 403},
		{"viewer reads metrics", "GET", "/metrics", ``, bearer(tokViewer), 200},
		{"no token for metrics", "GET", "/metrics", ``, nil, 401},
		{"no token", "GET", "/v1/tenants/a", ``, nil, 401},
		{"not a bearer token", "GET", "/v1/tenants/a", ``, []string{"Authorization", "Basic " + tokAdmin}, 401},
		{"health needs no token", "GET", "/healthz", ``, nil, 200},
		{"readiness needs no token", "GET", "/readyz", ``, nil, 200},
	}
	for _, c := range cases {
		if st, body := callRaw(t, c.method, base+c.path, c.body, c.header...); st != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, st, body, c.status)
		}
	}

	// The status page itself holds no data: the same bytes whoever asks, and
	// its script reads the API with the operator's token (the routes above
	// and below).
	_, anon := callRaw(t, "GET", base+"/", "")
	for _, h := range [][]string{p, bearer(tokViewer), bearer(tokAdmin)} {
		if st, page := callRaw(t, "GET", base+"/", "", h...); st != 200 || page != anon || strings.Contains(page, `"b"`) {
			t.Errorf("status page with %v: %d, differs from the anonymous one: %v", h, st, page != anon)
		}
	}
	for _, c := range []struct {
		name, path string
		header     []string
		status     int
	}{
		{"producer asks who it is", "/v1/whoami", p, 200},
		{"no token asks who it is", "/v1/whoami", nil, 401},
		{"producer reads downstreams", "/v1/downstreams", p, 403},
		{"viewer reads downstreams", "/v1/downstreams", bearer(tokViewer), 200},
		{"producer reads b's history", "/v1/history?tenant=a&tenant=b", p, 403},
		{"producer reads its history", "/v1/history?tenant=a", p, 200},
	} {
		if st, body := callRaw(t, "GET", base+c.path, "", c.header...); st != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, st, body, c.status)
		}
	}

	// A job of b and a job that does not exist: the very same answers.
	for _, route := range []struct{ method, suffix string }{{"GET", ""}, {"DELETE", ""}, {"POST", "/retry"}} {
		method := route.method
		stB, bodyB := callRaw(t, method, base+"/v1/jobs/"+jobB+route.suffix, "", p...)
		stU, bodyU := callRaw(t, method, base+"/v1/jobs/"+unknown+route.suffix, "", p...)
		if stB != 404 || stB != stU || bodyB != bodyU || strings.Contains(bodyB, "+15550199") {
			t.Errorf("%s b's job: %d %q; unknown job: %d %q", method, stB, bodyB, stU, bodyU)
		}
	}
	// The cancel did nothing.
	if _, _, j := call(t, "GET", base+"/v1/jobs/"+jobB, "", bearer(tokAdmin)...); j["state"] != "queued" {
		t.Fatalf("b's job after the producer's cancel: %v", j)
	}

	// Wrong tokens, however close to a right one, get one and the same 401.
	right := tokAdmin
	var answers []string
	for _, wrong := range []string{"x", right[:len(right)-1], right + "x", right[:len(right)-1] + "X", strings.Repeat("y", 4096), " "} {
		st, body := callRaw(t, "GET", base+"/v1/tenants/a", "", bearer(wrong)...)
		if st != 401 {
			t.Fatalf("token %q: %d", wrong, st)
		}
		answers = append(answers, body)
	}
	for _, a := range answers[1:] {
		if a != answers[0] {
			t.Fatalf("401 answers differ: %q vs %q", a, answers[0])
		}
	}
}

func TestNoTokensMeansLoopbackOnly(t *testing.T) {
	testutil.SkipShort(t, "process test: starts the throttler binary three times")
	t.Parallel()
	ds := downstreamtest.New(t)
	open := writeConfig(t, "", ds)
	// The same file, but listening on every interface.
	raw, _ := os.ReadFile(open)
	everywhere := filepath.Join(t.TempDir(), "everywhere.toml")
	os.WriteFile(everywhere, []byte(strings.Replace(string(raw), `listen = "127.0.0.1:0"`, `listen = "0.0.0.0:0"`, 1)), 0o600)

	out, err := exec.Command(throttlerBinary(t), "serve", "--config", everywhere).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "throttler token new") || !strings.Contains(string(out), "not a loopback address") {
		t.Fatalf("serve on 0.0.0.0 without tokens: %v\n%s", err, out)
	}
	// With a token it starts (bound on every interface; the test talks to it
	// over loopback only).
	withToken := filepath.Join(t.TempDir(), "with-token.toml")
	os.WriteFile(withToken, []byte(strings.Replace(string(raw), `listen = "127.0.0.1:0"`, `listen = "0.0.0.0:0"`, 1)+tokensConfig()), 0o600)
	p := startProcess(t, withToken)
	port := p.base[strings.LastIndex(p.base, ":")+1:]
	if st, _ := callRaw(t, "GET", "http://127.0.0.1:"+port+"/v1/tenants/a", "", bearer(tokAdmin)...); st != 200 {
		t.Fatalf("with a token: %d", st)
	}
	p.kill9(t) // the next one uses the same store file
	// --insecure-no-auth lets it start without, and says so loudly.
	p = startProcess(t, everywhere, "--insecure-no-auth")
	if !strings.Contains(p.logs(), "NO AUTH") {
		t.Fatalf("no warning:\n%s", p.logs())
	}
}

// A client that sends its headers a byte a second is cut off by the header
// timeout, while other clients are served all along.
func TestSlowlorisIsCutOff(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, servicetest.WriteConfigServer(t, `read_header_timeout = "1s"`, "", ds.URL))
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closed := make(chan time.Time, 1)
	go func() {
		io.Copy(io.Discard, conn)
		closed <- time.Now()
	}()
	start := time.Now()
	var sent atomic.Int32
	stopWriting := make(chan struct{})
	writerDone := make(chan struct{})
	defer func() { close(stopWriting); <-writerDone }()
	go func() {
		defer close(writerDone)
		for _, b := range []byte("POST /v1/tenants/a/jobs HTTP/1.1\r\nHost: x\r\n") {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			sent.Add(1)
			select {
			case <-stopWriting:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	// Others are served meanwhile, promptly.
	for {
		select {
		case at := <-closed:
			if took := at.Sub(start); took > 2500*time.Millisecond {
				t.Fatalf("slow client cut off after %v, want about the 1s header timeout", took)
			}
			if n := sent.Load(); n > 3 {
				t.Fatalf("slow client sent %d bytes before being cut off", n)
			}
			return
		case <-time.After(100 * time.Millisecond):
			t0 := time.Now()
			if st, _ := callRaw(t, "GET", base+"/healthz", ""); st != 200 || time.Since(t0) > time.Second {
				t.Fatalf("another client: %d after %v", st, time.Since(t0))
			}
			if time.Since(start) > 10*time.Second {
				t.Fatal("slow client never cut off")
			}
		}
	}
}

// The payload limit is exact, and a huge chunked body is cut off at the
// limit without being read.
func TestBodyLimits(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, servicetest.WriteConfigServer(t, "max_body_bytes = 1000\nmax_batch_bytes = 4096", `[tenant_defaults]
rate = "100/s"
capacity = 100
`, ds.URL))
	exact := `{"payload":"` + strings.Repeat("x", 998) + `"}` // the payload is 1000 bytes
	if st, body := callRaw(t, "POST", base+"/v1/tenants/a/jobs", exact); st != 202 {
		t.Fatalf("payload of exactly the limit: %d %s", st, body)
	}
	over := `{"payload":"` + strings.Repeat("x", 999) + `"}`
	if st, body := callRaw(t, "POST", base+"/v1/tenants/a/jobs", over); st != 413 || !strings.Contains(body, "payload_too_large") {
		t.Fatalf("one byte over: %d %s", st, body)
	}
	// 10 GB, chunked, that nobody should read.
	for _, path := range []string{"/v1/tenants/a/jobs", "/v1/tenants/a/jobs:batch", "/v1/tenants/a"} {
		src := &endless{limit: 10 << 30}
		req, _ := http.NewRequest("POST", base+path, src)
		req.ContentLength = -1 // chunked
		start := time.Now()
		resp, err := httpClient.Do(req)
		took := time.Since(start)
		read := src.n.Load()
		if err == nil {
			resp.Body.Close()
		}
		if read > 16<<20 || took > 10*time.Second {
			t.Fatalf("%s: %d bytes read from a 10 GB body in %v", path, read, took)
		}
		if err == nil && path != "/v1/tenants/a" && resp.StatusCode != 413 {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
	}
	// Nothing of it was queued.
	if _, _, ten := call(t, "GET", base+"/v1/tenants/a", ""); ten["accepted_total"] != 1.0 {
		t.Fatalf("tenant after the big bodies: %v", ten)
	}
}

// endless is a body of limit bytes of JSON-ish junk that counts what was read.
type endless struct {
	limit int64
	n     atomic.Int64
}

func (e *endless) Read(p []byte) (int, error) {
	if e.n.Load() >= e.limit {
		return 0, io.EOF
	}
	if e.n.Load() == 0 && len(p) > 12 {
		n := copy(p, `{"payload":"`)
		e.n.Add(int64(n))
		return n, nil
	}
	for i := range p {
		p[i] = 'x'
	}
	e.n.Add(int64(len(p)))
	return len(p), nil
}

// 2,000 connections at once, half-open or all asking at the same moment: the
// process stays up, keeps serving, sheds what it cannot take with 503, and
// its memory stays under a stated bound.
func TestTwoThousandConnections(t *testing.T) {
	testutil.SkipShort(t, "process and load test: 2,000 connections to the throttler binary")
	t.Parallel()
	const bound = 200 << 20 // bytes of resident memory: the figure docs/access.md states
	ds := downstreamtest.New(t)
	p := startProcess(t, servicetest.WriteConfigServer(t, `read_header_timeout = "20s"`, `[tenant_defaults]
rate = "1000/s"
capacity = 100000
`, ds.URL))
	addr := strings.TrimPrefix(p.base, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 2000; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.Write([]byte("GET /healthz HTTP/1.1\r\n")) // and never the rest
		conns = append(conns, c)
	}
	if st, _ := callRaw(t, "GET", p.base+"/healthz", ""); st != 200 {
		t.Fatalf("with 2000 half-open connections: %d", st)
	}
	rssHalfOpen := rss(t, p.cmd.Process.Pid)

	// 2000 clients asking at once, each on its own connection.
	var wg sync.WaitGroup
	var ok, shed, other atomic.Int32
	start := make(chan struct{})
	for i := 0; i < 2000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				other.Add(1)
				return
			}
			defer c.Close()
			<-start
			body := fmt.Sprintf(`{"payload":{"n":%d}}`, i)
			fmt.Fprintf(c, "POST /v1/tenants/t%d/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", i%50, len(body), body)
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			switch {
			case err != nil:
				other.Add(1)
			case resp.StatusCode == 202:
				ok.Add(1)
			case resp.StatusCode == 503:
				shed.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if other.Load() > 0 || ok.Load() == 0 {
		t.Fatalf("2000 at once: %d accepted, %d shed (503), %d other", ok.Load(), shed.Load(), other.Load())
	}
	rssAfter := rss(t, p.cmd.Process.Pid)
	t.Logf("2000 half-open connections: RSS %d MiB; then 2000 requests at once: %d accepted, %d shed; RSS %d MiB",
		rssHalfOpen>>20, ok.Load(), shed.Load(), rssAfter>>20)
	if rssHalfOpen > bound || rssAfter > bound {
		t.Fatalf("resident memory %d / %d MiB, bound %d MiB", rssHalfOpen>>20, rssAfter>>20, bound>>20)
	}
	if st, _ := callRaw(t, "GET", p.base+"/healthz", ""); st != 200 {
		t.Fatalf("after the storm: %d", st)
	}
}

// rss reads a process's resident memory from /proc.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// With tls_cert and tls_key the API is served over HTTPS.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)

	ds := downstreamtest.New(t)
	base := startServer(t, servicetest.WriteConfigServer(t, fmt.Sprintf("tls_cert = %q\ntls_key = %q", certFile, keyFile), "", ds.URL))
	pool := x509.NewCertPool()
	cert, _ := x509.ParseCertificate(der)
	pool.AddCert(cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(strings.Replace(base, "http://", "https://", 1) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("status %d, tls %v", resp.StatusCode, resp.TLS != nil)
	}
}
