package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// End to end against vendor-shaped servers (DESIGN.md section 6a): each
// server checks what the real vendor checks, with the standard library's
// own parsers, and a throttler process sends to it as its config says.

// vendorConfig writes a config for a test's own downstreams: a listener on
// a free port, the store (embedded, in the test's directory; or the Redis
// at redisURL), then body (downstreams and tenants).
func vendorConfig(t *testing.T, redisURL, body string) string {
	t.Helper()
	dir := t.TempDir()
	store := fmt.Sprintf("[store]\npath = %q\n", filepath.Join(dir, "throttler.db"))
	if redisURL != "" {
		store = fmt.Sprintf("[store]\nbackend = \"redis\"\nredis_url = %q\nredis_lease = \"1s\"\n", redisURL)
	}
	p := filepath.Join(dir, "config.toml")
	full := "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n" + store + body
	if err := os.WriteFile(p, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeFile writes a file of the test's own (a secret, a config) and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// enqueueJob enqueues one job (the JSON body of POST .../jobs) and returns
// its id.
func enqueueJob(t *testing.T, base, tenant, body string) string {
	t.Helper()
	st, _, ans := call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs", body)
	if st != http.StatusAccepted {
		t.Fatalf("enqueue %s: %d %v", body, st, ans)
	}
	return ans["id"].(string)
}

// waitJob waits until job id, as GET /v1/jobs/{id} shows it, satisfies
// cond, and returns it.
func waitJob(t *testing.T, base, id, what string, cond func(j map[string]any) bool) map[string]any {
	t.Helper()
	var j map[string]any
	testutil.WaitFor(t, 15*time.Second, "job "+id+" "+what, atMostEvery(50*time.Millisecond, func() bool {
		j = jobState(t, base, id)
		return cond(j)
	}))
	return j
}

func inState(state string) func(map[string]any) bool {
	return func(j map[string]any) bool { return j["state"] == state }
}

// response is the answer kept on a job, as the API shows it.
func response(t *testing.T, j map[string]any) (status int, headers map[string]any, body string) {
	t.Helper()
	r, ok := j["response"].(map[string]any)
	if !ok {
		t.Fatalf("job %v shows no response", j["id"])
	}
	headers, _ = r["headers"].(map[string]any)
	body, _ = r["body"].(string)
	return int(r["status"].(float64)), headers, body
}

// Twilio: Basic auth (the password from password_env), a form body with
// MediaUrl repeated, over HTTPS on a private CA (tls_ca_file); the 201's
// sid is kept on the job.
func TestTwilioShapedDelivery(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary")
	pki := tlstest.New(t)
	t.Setenv("THROTTLER_TEST_TWILIO_TOKEN", "tw-token-e2e-5c1f")
	var mu sync.Mutex
	var forms []url.Values
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if !ok || user != "AC0123" || pass != "tw-token-e2e-5c1f" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"code":20003,"message":"Authenticate"}`)
			return
		}
		if r.Method != "POST" || r.URL.Path != "/2010-04-01/Accounts/AC0123/Messages.json" || r.ParseForm() != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		forms = append(forms, r.PostForm)
		n := len(forms)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sid":"SM%032d","status":"queued"}`, n)
	}))
	srv.TLS = pki.ServerConfig(false)
	srv.StartTLS()
	defer srv.Close()
	file := vendorConfig(t, "", fmt.Sprintf(`[tenant_defaults]
downstream = "twilio"
rate = "20/s"
[downstreams.twilio]
url = "%s/2010-04-01/Accounts/AC0123/Messages.json"
body = "form"
headers = { Accept = "application/json" }
auth = { type = "basic", username = "AC0123", password_env = "THROTTLER_TEST_TWILIO_TOKEN" }
tls_ca_file = %q
`, srv.URL, pki.CAFile))
	p := startProcess(t, file)
	id := enqueueJob(t, p.base, "acme", `{"payload":{"To":"+15550100","From":"+15550199","Body":"Your code is 1234","MediaUrl":["https://x.example/1.png","https://x.example/2.png"]}}`)
	j := waitJob(t, p.base, id, "succeeded", inState("succeeded"))

	mu.Lock()
	if len(forms) != 1 {
		t.Fatalf("%d messages at Twilio, want 1", len(forms))
	}
	want := url.Values{"To": {"+15550100"}, "From": {"+15550199"}, "Body": {"Your code is 1234"},
		"MediaUrl": {"https://x.example/1.png", "https://x.example/2.png"}}
	if !reflect.DeepEqual(forms[0], want) {
		t.Fatalf("form at Twilio %v, want %v", forms[0], want)
	}
	mu.Unlock()
	status, headers, body := response(t, j)
	if status != 201 || !strings.Contains(body, `"sid":"SM00000000000000000000000000000001"`) || headers["Content-Type"] != "application/json" {
		t.Fatalf("response kept %d %v %q, want the 201 with its sid", status, headers, body)
	}
	if strings.Contains(p.logs(), "tw-token-e2e-5c1f") {
		t.Fatal("the password is in the log")
	}
}

// stripe is a Stripe-shaped server: a bearer secret key, form bodies with
// nested keys, refunds under /v1/refunds for the connected account a job
// names, answers stored by Idempotency-Key and replayed for a repeat, and
// a card decline as a 402 with a JSON error.
type stripe struct {
	key string
	mu  sync.Mutex
	// stored answers by Idempotency-Key; created counts refunds made.
	stored  map[string]stripeAnswer
	created int
	// lost: the answer to the first refund of amount 700 was lost (the
	// refund was made and stored; a 500 went back).
	lost bool
}

type stripeAnswer struct {
	status int
	body   string
}

func (s *stripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+s.key {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided"}}`)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	form, err := url.ParseQuery(string(raw))
	key := r.Header.Get("Idempotency-Key")
	if err != nil || r.URL.Path != "/v1/refunds" || r.Header.Get("Stripe-Account") != "acct_1" || key == "" ||
		form.Get("metadata[order_id]") == "" || form.Get("items[0][price]") != "price_1" || form.Get("items[0][quantity]") != "2" {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"type":"invalid_request_error","message":"bad refund %s %s %q"}}`, r.URL.Path, r.Header.Get("Stripe-Account"), raw)
		return
	}
	s.mu.Lock()
	a, repeat := s.stored[key]
	if !repeat {
		s.created++
		a = stripeAnswer{200, fmt.Sprintf(`{"id":"re_%d","object":"refund","amount":%s,"metadata":{"order_id":%q}}`, s.created, form.Get("amount"), form.Get("metadata[order_id]"))}
		if form.Get("amount") == "666" {
			a = stripeAnswer{402, `{"error":{"type":"card_error","code":"card_declined","message":"Your card was declined."}}`}
		}
		s.stored[key] = a
	}
	lose := !repeat && form.Get("amount") == "700" && !s.lost
	if lose {
		s.lost = true
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+key[len(key)-6:])
	if lose {
		w.WriteHeader(http.StatusInternalServerError) // made and stored, the answer lost
		return
	}
	if repeat {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// Stripe on the embedded store.
func TestStripeShapedDelivery(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	stripeDelivery(t, "")
}

// Stripe on Redis: the request and the answers are kept in the job's hash.
func TestStripeShapedDeliveryOnRedis(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary on a redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	stripeDelivery(t, redistest.Start(t, false).URL())
}

// stripeDelivery: a refund a job asks for (its path within job_paths, its
// Stripe-Account header), with nested form keys and the bearer key from
// token_file; a refund whose first answer is lost is sent again with the
// same Idempotency-Key and Stripe's stored answer is replayed (made once);
// a declined card ends the job failed with the 402's body kept.
func stripeDelivery(t *testing.T, redisURL string) {
	s := &stripe{key: "sk_test_e2e_9d2b", stored: map[string]stripeAnswer{}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	file := vendorConfig(t, redisURL, fmt.Sprintf(`[tenant_defaults]
downstream = "stripe"
rate = "20/s"
[downstreams.stripe]
url = "%s/v1/charges"
body = "form"
auth = { type = "bearer", token_file = %q }
job_paths = ["/v1/refunds"]
job_headers = ["Stripe-Account"]
keep_response_headers = ["Idempotent-Replayed", "Request-Id"]
max_attempts = 3
`, srv.URL, writeFile(t, "stripe-key", s.key+"\n")))
	p := startProcess(t, file)
	refund := func(amount int) string {
		return enqueueJob(t, p.base, "shop", fmt.Sprintf(`{"payload":{"charge":"ch_1","amount":%d,"metadata":{"order_id":"o-%d"},"items":[{"price":"price_1","quantity":2}]},
			"request":{"path":"/v1/refunds","headers":{"Stripe-Account":"acct_1"}}}`, amount, amount))
	}
	ok, lost, declined := refund(500), refund(700), refund(666)

	j := waitJob(t, p.base, ok, "succeeded", inState("succeeded"))
	if status, _, body := response(t, j); status != 200 || !strings.Contains(body, `"object":"refund"`) || !strings.Contains(body, `"order_id":"o-500"`) {
		t.Fatalf("refund kept %d %q", status, body)
	}
	if req, _ := j["request"].(map[string]any); req == nil || req["path"] != "/v1/refunds" {
		t.Fatalf("job shows request %v", j["request"])
	}

	j = waitJob(t, p.base, lost, "succeeded after its answer was lost", inState("succeeded"))
	status, headers, body := response(t, j)
	if status != 200 || headers["Idempotent-Replayed"] != "true" || headers["Request-Id"] == nil || !strings.Contains(body, `"order_id":"o-700"`) {
		t.Fatalf("replayed refund kept %d %v %q, want Stripe's stored answer", status, headers, body)
	}
	if a := j["attempts"].(float64); a != 2 {
		t.Fatalf("%v attempts, want 2 (one lost answer)", a)
	}

	j = waitJob(t, p.base, declined, "failed", inState("failed"))
	status, _, body = response(t, j)
	if status != 402 || !strings.Contains(body, `"code":"card_declined"`) || !strings.Contains(j["last_error"].(string), "402") {
		t.Fatalf("declined job: response %d %q, last_error %v", status, body, j["last_error"])
	}
	var decoded map[string]map[string]string
	if err := json.Unmarshal([]byte(body), &decoded); err != nil || decoded["error"]["type"] != "card_error" {
		t.Fatalf("the 402's body kept is not Stripe's JSON error: %q %v", body, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created != 3 {
		t.Fatalf("%d refunds made at Stripe, want 3 (a repeated key replays, it does not refund twice)", s.created)
	}
}

// A bank on a private CA that requires a client certificate: delivered with
// the right tls_ca_file, tls_cert_file and tls_key_file; with a CA that did
// not sign the bank's certificate, the job's last_error names the failure.
func TestBankMutualTLS(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	pki := tlstest.New(t)
	var mu sync.Mutex
	var clients []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		clients = append(clients, r.TLS.PeerCertificates[0].Subject.CommonName)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"accepted"}`)
	}))
	srv.TLS = pki.ServerConfig(true)
	srv.StartTLS()
	defer srv.Close()
	wrongCA := tlstest.New(t).CAFile
	bank := `
[downstreams.%s]
url = "%s/payments"
tls_ca_file = %q
tls_cert_file = %q
tls_key_file = %q
`
	file := vendorConfig(t, "", "[tenant_defaults]\ndownstream = \"bank\"\n[tenants.misconfigured]\ndownstream = \"bank_wrong_ca\"\n"+
		fmt.Sprintf(bank, "bank", srv.URL, pki.CAFile, pki.ClientCertFile, pki.ClientKeyFile)+
		fmt.Sprintf(bank, "bank_wrong_ca", srv.URL, wrongCA, pki.ClientCertFile, pki.ClientKeyFile))
	p := startProcess(t, file)
	good := enqueueJob(t, p.base, "treasury", `{"payload":{"amount":"100.00","currency":"EUR"}}`)
	bad := enqueueJob(t, p.base, "misconfigured", `{"payload":{"amount":"1.00","currency":"EUR"}}`)
	j := waitJob(t, p.base, good, "succeeded", inState("succeeded"))
	if status, _, body := response(t, j); status != 200 || body != `{"status":"accepted"}` {
		t.Fatalf("bank's answer kept %d %q", status, body)
	}
	j = waitJob(t, p.base, bad, "with a TLS failure", func(j map[string]any) bool { return j["last_error"] != nil })
	msg := j["last_error"].(string)
	if j["state"] != "retrying" || !strings.Contains(msg, "TLS: unknown authority") || !strings.Contains(msg, "downstreams.bank_wrong_ca.tls_ca_file") {
		t.Fatalf("job to the bank with the wrong CA: %v, last_error %q; want a retried connection error naming the unknown authority", j["state"], msg)
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(clients, []string{"throttler"}) {
		t.Fatalf("client certificates seen by the bank %v, want one request with the throttler's", clients)
	}
}
