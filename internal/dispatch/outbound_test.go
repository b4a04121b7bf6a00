package dispatch

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// compileDS compiles downstream d (its url set to url) as a reload would.
func compileDS(t testing.TB, url string, d config.Downstream) *outbound.Downstream {
	t.Helper()
	d.URL = url
	o, err := outbound.Compile("vendor", d)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// secretFile writes value to a file of its own and returns its path.
func secretFile(t testing.TB, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// routeTo is a route of downstream "vendor" through o.
func routeTo(o *outbound.Downstream) Route {
	return Route{Downstream: "vendor", Outbound: o, Timeout: 2 * time.Second, MaxAttempts: 5,
		Policy: leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1, Capacity: 10}}
}

func newOutboundDispatcher(t testing.TB, route func() Route) *Dispatcher {
	t.Helper()
	d := New(Options{Routes: func(string) Route { return route() }, Client: NewClient(16)})
	t.Cleanup(d.CloseIdleConnections)
	return d
}

// hookKey is the key of the signing secret these tests use.
var hookKey = []byte("a key of the tests' own, 32 bytes")

// The request is built as the downstream's config says (form body, Basic
// auth, the job's path and header), signed at the send with the slot's
// time, and the answer is kept on the outcome.
func TestRequestAsTheDownstreamSays(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got *http.Request
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, gotBody = r, string(b)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req_9")
		w.Header().Set("Set-Cookie", "session=never-kept")
		w.WriteHeader(201)
		io.WriteString(w, `{"sid":"SM0123"}`)
	}))
	defer srv.Close()
	o := compileDS(t, srv.URL+"/2010-04-01/Messages.json", config.Downstream{
		Body:     config.BodyForm,
		Auth:     config.DownstreamAuth{Type: config.AuthBasic, Username: "AC0123", PasswordFile: secretFile(t, "tw-secret")},
		JobPaths: []string{"/v1/*"}, JobHeaders: []string{"Stripe-Account"}, KeepResponseHeaders: []string{"X-Request-Id"},
		SigningSecretFile: secretFile(t, outbound.SecretPrefix+base64.StdEncoding.EncodeToString(hookKey)),
	})
	d := newOutboundDispatcher(t, func() Route { return routeTo(o) })
	j := job(jobID, 1, time.Now().Add(30*time.Millisecond))
	j.Payload = []byte(`{"To":"+15550100","MediaUrl":["https://a/1.png","https://a/2.png"],"meta":{"n":1}}`)
	j.Request = &queue.JobRequest{Path: "/v1/refunds", Headers: map[string]string{"stripe-account": "acct_1"}}
	out := d.Handle(context.Background(), j)

	want := &queue.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json", "X-Request-Id": "req_9"}, Body: `{"sid":"SM0123"}`}
	if out.Result != queue.Succeeded || out.Status != 201 || fmt.Sprint(out.Response) != fmt.Sprint(want) {
		t.Fatalf("outcome %+v answer %+v, want success with %+v", out, out.Response, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if user, pass, ok := got.BasicAuth(); !ok || user != "AC0123" || pass != "tw-secret" {
		t.Fatalf("basic auth %q %q %v", user, pass, ok)
	}
	if got.URL.Path != "/v1/refunds" || got.Header.Get("Stripe-Account") != "acct_1" || got.Header.Get("Idempotency-Key") != jobID {
		t.Fatalf("request %s %v", got.URL, got.Header)
	}
	if gotBody != "To=%2B15550100&MediaUrl=https%3A%2F%2Fa%2F1.png&MediaUrl=https%3A%2F%2Fa%2F2.png&meta%5Bn%5D=1" {
		t.Fatalf("form body %q", gotBody)
	}
	// The signature, checked here by the Standard Webhooks scheme itself,
	// carries the slot's second (the send's, not the hand-over's).
	ts := got.Header.Get("Webhook-Timestamp")
	if ts != strconv.FormatInt(j.DispatchAt.Unix(), 10) || got.Header.Get("Webhook-Id") != jobID {
		t.Fatalf("webhook-timestamp %s webhook-id %s, want %d and the job id", ts, got.Header.Get("Webhook-Id"), j.DispatchAt.Unix())
	}
	mac := hmac.New(sha256.New, hookKey)
	io.WriteString(mac, jobID+"."+ts+"."+gotBody)
	if sig := got.Header.Get("Webhook-Signature"); sig != "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("webhook-signature %q does not verify", sig)
	}
}

// Every answer is kept on the outcome, whatever it decides: a failure for
// good, a failure retried, a pushback; a long body is cut at
// keep_response_bytes and said to be.
func TestEveryAnswerIsKept(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status int
		header string // Retry-After
		body   string
		result queue.Result
		kept   string
		cut    bool
	}{
		{402, "", `{"error":{"code":"card_declined"}}`, queue.Failed, `{"error":`, true},
		{503, "", "busy", queue.Retry, "busy", false},
		{429, "7", "slow down", queue.Retry, "slow down", false},
		{200, "", strings.Repeat("é", 10), queue.Succeeded, strings.Repeat("é", 4), true}, // 8 bytes kept of 20: whole runes
	}
	for _, c := range cases {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.header != "" {
					w.Header().Set("Retry-After", c.header)
				}
				w.WriteHeader(c.status)
				io.WriteString(w, c.body)
			}))
			defer srv.Close()
			o := compileDS(t, srv.URL, config.Downstream{KeepResponseBytes: ptr(9)})
			d := newOutboundDispatcher(t, func() Route { return routeTo(o) })
			out := d.Handle(context.Background(), job(jobID, 1, time.Now()))
			r := out.Response
			if out.Result != c.result || r == nil || r.Status != c.status || r.Body != c.kept || r.Truncated != c.cut ||
				r.Headers["Retry-After"] != c.header {
				t.Fatalf("outcome %+v answer %+v, want %v keeping %q (cut %v)", out, r, c.result, c.kept, c.cut)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A job whose request its downstream no longer allows (a reload since it
// was admitted) fails at once, naming the config key, and nothing is sent.
func TestRequestNoLongerAllowedFailsWithoutASend(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	o := compileDS(t, srv.URL, config.Downstream{JobPaths: []string{"/v2/*"}})
	d := newOutboundDispatcher(t, func() Route { return routeTo(o) })
	j := job(jobID, 1, time.Now())
	j.Request = &queue.JobRequest{Path: "/v1/refunds"}
	out := d.Handle(context.Background(), j)
	if out.Result != queue.Failed || !out.SentAt.IsZero() || !strings.Contains(out.Error, "downstreams.vendor.job_paths") {
		t.Fatalf("outcome %+v, want failed naming downstreams.vendor.job_paths, nothing sent", out)
	}
	if n := len(rec.all()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
	if d.Breakers()["vendor"] {
		t.Fatal("the breaker opened on a job that was never sent")
	}
}

// A TLS failure is a connection error (retried) whose message names it.
func TestTLSFailuresAreNamed(t *testing.T) {
	t.Parallel()
	pki := tlstest.New(t)
	other := tlstest.New(t)
	expiredCert, expiredKey := pki.Issue(t, "expired", tlstest.Leaf{Hosts: []string{"127.0.0.1"}, NotAfter: time.Now().Add(-time.Hour)})
	elsewhereCert, elsewhereKey := pki.Issue(t, "elsewhere", tlstest.Leaf{Hosts: []string{"elsewhere.example"}})
	serve := func(certFile, keyFile string) string {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	cases := []struct {
		name, url, ca, want string
	}{
		{"unknown authority", serve(pki.ServerCertFile, pki.ServerKeyFile), other.CAFile, "unknown authority: the downstream's certificate is not signed by a CA that downstreams.vendor.tls_ca_file trusts"},
		{"expired", serve(expiredCert, expiredKey), pki.CAFile, "expired certificate"},
		{"name mismatch", serve(elsewhereCert, elsewhereKey), pki.CAFile, "name mismatch"},
		{"system roots", serve(pki.ServerCertFile, pki.ServerKeyFile), "", "unknown authority: the downstream's certificate is not signed by a CA that the system's roots trusts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := compileDS(t, c.url, config.Downstream{TLSCAFile: c.ca})
			d := newOutboundDispatcher(t, func() Route { return routeTo(o) })
			out := d.Handle(context.Background(), job(jobID, 1, time.Now()))
			if out.Result != queue.Retry || out.Status != 0 || !strings.HasPrefix(out.Error, "connection error: TLS: ") || !strings.Contains(out.Error, c.want) {
				t.Fatalf("outcome %+v, want a connection error naming %q", out, c.want)
			}
		})
	}
}

// Mutual TLS: the client certificate is presented, and a reload that
// changes the TLS config (a CA that does not trust the server) is used
// from the next connection on: the old transport's pooled connection is
// not reused.
func TestMutualTLSAndReloadedTLS(t *testing.T) {
	t.Parallel()
	pki := tlstest.New(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 {
			w.WriteHeader(401)
		}
	}))
	srv.TLS = pki.ServerConfig(true)
	srv.StartTLS()
	defer srv.Close()
	var mu sync.Mutex
	o := compileDS(t, srv.URL, config.Downstream{TLSCAFile: pki.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile})
	d := newOutboundDispatcher(t, func() Route { mu.Lock(); defer mu.Unlock(); return routeTo(o) })
	if out := d.Handle(context.Background(), job(jobID, 1, time.Now())); out.Result != queue.Succeeded {
		t.Fatalf("mutual TLS: %+v", out)
	}
	reloaded := compileDS(t, srv.URL, config.Downstream{TLSCAFile: tlstest.New(t).CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile})
	mu.Lock()
	o = reloaded
	mu.Unlock()
	d.UseTLS([]*outbound.Downstream{reloaded})
	if out := d.Handle(context.Background(), job(jobID, 2, time.Now())); out.Result != queue.Retry || !strings.Contains(out.Error, "unknown authority") {
		t.Fatalf("after the reload: %+v, want the new CA used (unknown authority)", out)
	}
	d.clients.mu.Lock()
	defer d.clients.mu.Unlock()
	if _, ok := d.clients.byKey[reloaded.TLSKey()]; !ok || len(d.clients.byKey) != 1 {
		t.Fatalf("%d transports kept, want only the reloaded config's", len(d.clients.byKey))
	}
}

// HTTPS sends are paced as HTTP ones are: the TLS handshake is part of the
// connection setup before the slot, and the write passes the gate under
// the *tls.Conn. Cold connections: each job dials its own.
//
// Not parallel: timing is measured on a machine doing nothing else.
func TestHTTPSPacingSeenAtTheDownstream(t *testing.T) {
	pki := tlstest.New(t)
	ds := downstreamtest.NewTLS(t, pki.ServerConfig(false))
	T := 20 * time.Millisecond
	o := compileDS(t, ds.URL, config.Downstream{TLSCAFile: pki.CAFile})
	r := routeTo(o)
	r.Policy = leaky.Policy{Interval: T, Burst: 1, Capacity: 100}
	d := newOutboundDispatcher(t, func() Route { return r })
	sendThirtyPaced(t, d, ds, T, time.Now().Add(100*time.Millisecond))
}
