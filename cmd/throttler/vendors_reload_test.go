package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// Secrets and TLS files are read again at SIGHUP; a reload that cannot read
// one keeps the running config; HTTPS is paced like HTTP.

// hookReceiver verifies Standard Webhooks signatures as a receiver of its
// own would, independently of internal/outbound: the signed content is
// "id.timestamp.body" over the exact bytes received, each signature
// "v1,<base64 HMAC-SHA256>", space-separated, and the timestamp within
// five minutes.
type hookReceiver struct {
	keys map[string][]byte // by name
	mu   sync.Mutex
	got  []signedDelivery
}

// signedDelivery is one request as the receiver saw it: the job id, and
// per signature the name of the key that verifies it ("" none).
type signedDelivery struct {
	id       string
	verifies []string
	fresh    bool
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id, ts := r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	d := signedDelivery{id: id, fresh: err == nil && time.Since(time.Unix(sec, 0)).Abs() < 5*time.Minute}
	ok := false
	for _, sig := range strings.Fields(r.Header.Get("Webhook-Signature")) {
		by := ""
		if raw, found := strings.CutPrefix(sig, "v1,"); found {
			got, _ := base64.StdEncoding.DecodeString(raw)
			for name, key := range h.keys {
				mac := hmac.New(sha256.New, key)
				mac.Write([]byte(id + "." + ts + "."))
				mac.Write(body)
				if hmac.Equal(got, mac.Sum(nil)) {
					by = name
				}
			}
		}
		d.verifies = append(d.verifies, by)
		ok = ok || (by != "" && d.fresh)
	}
	h.mu.Lock()
	h.got = append(h.got, d)
	h.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
	}
}

func (h *hookReceiver) deliveries() []signedDelivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]signedDelivery(nil), h.got...)
}

func whsec(key []byte) string { return "whsec_" + base64.StdEncoding.EncodeToString(key) }

// A rotation of the signing secret: with two secrets in signing_secret_file
// each attempt carries two signatures, each verified by its own key; the
// file changed to the new key alone and SIGHUP, the next attempt carries
// one, the new key's.
func TestWebhookSignaturesAcrossARotation(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGHUP to the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	oldKey, newKey := make([]byte, 32), make([]byte, 32)
	rand.Read(oldKey)
	rand.Read(newKey)
	hooks := &hookReceiver{keys: map[string][]byte{"old": oldKey, "new": newKey}}
	srv := httptest.NewServer(hooks)
	defer srv.Close()
	secrets := writeFile(t, "hook-secrets", whsec(oldKey)+" "+whsec(newKey)+"\n")
	file := vendorConfig(t, "", fmt.Sprintf("[tenant_defaults]\ndownstream = \"hooks\"\n[downstreams.hooks]\nurl = \"%s/hooks/throttler\"\nsigning_secret_file = %q\n", srv.URL, secrets))
	config, _ := os.ReadFile(file)
	p := startProcess(t, file)

	first := enqueueJob(t, p.base, "app", `{"payload":{"type":"invoice.paid","id":"in_1"}}`)
	waitJob(t, p.base, first, "succeeded", inState("succeeded"))
	if err := os.WriteFile(secrets, []byte(whsec(newKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.reload(t, file, string(config), "config reloaded")
	second := enqueueJob(t, p.base, "app", `{"payload":{"type":"invoice.paid","id":"in_2"}}`)
	waitJob(t, p.base, second, "succeeded", inState("succeeded"))

	got := hooks.deliveries()
	want := []signedDelivery{{first, []string{"old", "new"}, true}, {second, []string{"new"}, true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("deliveries (job id, key verifying each signature, fresh): %v, want %v", got, want)
	}
	for _, key := range [][]byte{oldKey, newKey} {
		if strings.Contains(p.logs(), whsec(key)) {
			t.Fatal("a signing secret is in the log")
		}
	}
}

// A secret file changed and SIGHUP: the next attempt uses the new secret.
// A reload whose secret cannot be read (an environment variable that is
// not set) is refused: the log names the key, no value, and the running
// config (with the secret read before) goes on.
func TestSecretReloadAndARefusedReload(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGHUP to the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	const unset = "THROTTLER_TEST_NEVER_SET_7a3e"
	if _, set := os.LookupEnv(unset); set {
		t.Fatalf("%s is set", unset)
	}
	var mu sync.Mutex
	var auths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer srv.Close()
	token := writeFile(t, "token", "token-one-51c0\n")
	withFile := fmt.Sprintf("[tenant_defaults]\ndownstream = \"vendor\"\n[downstreams.vendor]\nurl = %q\nauth = { type = \"bearer\", token_file = %q }\n", srv.URL, token)
	file := vendorConfig(t, "", withFile)
	config, _ := os.ReadFile(file)
	p := startProcess(t, file)
	deliver := func(n int) {
		t.Helper()
		id := enqueueJob(t, p.base, "acme", fmt.Sprintf(`{"payload":{"n":%d}}`, n))
		waitJob(t, p.base, id, "succeeded", inState("succeeded"))
	}

	deliver(1)
	if err := os.WriteFile(token, []byte("token-two-8e44\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.reload(t, file, string(config), "config reloaded")
	deliver(2)
	broken := strings.Replace(string(config), fmt.Sprintf("token_file = %q", token), fmt.Sprintf("token_env = %q", unset), 1)
	p.reload(t, file, broken, "config reload refused")
	deliver(3)

	mu.Lock()
	want := []string{"Bearer token-one-51c0", "Bearer token-two-8e44", "Bearer token-two-8e44"}
	if fmt.Sprint(auths) != fmt.Sprint(want) {
		t.Fatalf("Authorization of each attempt %q, want %q", auths, want)
	}
	mu.Unlock()
	logs := p.logs()
	if !strings.Contains(logs, `"key":"downstreams.vendor.auth.token_env"`) || !strings.Contains(logs, unset) {
		t.Fatalf("the refused reload's log does not name the key and the variable:\n%s", logs)
	}
	if strings.Contains(logs, "token-one") || strings.Contains(logs, "token-two") {
		t.Fatalf("a secret is in the log:\n%s", logs)
	}
}

// A secret that cannot be read at start refuses the start, naming the key
// (and never a value).
func TestStartRefusedWithoutASecret(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	file := vendorConfig(t, "", "[downstreams.vendor]\nurl = \"http://127.0.0.1:9/\"\nauth = { type = \"basic\", username = \"u\", password_file = \"/nonexistent/throttler-test-secret\" }\n")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, throttlerBinary(t), "serve", "--config", file).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("serve started without its secret (err %v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "downstreams.vendor.auth.password_file") || strings.Contains(string(out), "throttler started") {
		t.Fatalf("the refusal does not name downstreams.vendor.auth.password_file:\n%s", out)
	}
}

// HTTPS is paced as HTTP is (DESIGN.md invariant 1): one tenant at 20/s,
// 30 jobs at once, seen at the downstream (after each TLS handshake) no
// closer than T - 2 ms.
func TestHTTPSDeliveriesArePaced(t *testing.T) {
	testutil.SkipShort(t, "process test: runs the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	pki := tlstest.New(t)
	ds := downstreamtest.NewTLS(t, pki.ServerConfig(false))
	file := vendorConfig(t, "", fmt.Sprintf("[tenant_defaults]\nrate = \"20/s\"\ncapacity = 50\n[downstreams.tls]\nurl = %q\ntls_ca_file = %q\n", ds.URL+"/send", pki.CAFile))
	p := startProcess(t, file)
	var batch strings.Builder
	batch.WriteString(`{"jobs":[`)
	for i := range 30 {
		if i > 0 {
			batch.WriteString(",")
		}
		fmt.Fprintf(&batch, `{"payload":{"n":%d}}`, i)
	}
	batch.WriteString("]}")
	if st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs:batch", batch.String()); st != 200 {
		t.Fatalf("batch: %d %v", st, body)
	}
	testutil.WaitFor(t, 10*time.Second, "30 deliveries", func() bool { return len(ds.All()) >= 30 })
	a := ds.All()
	if len(a) != 30 || len(ds.Keys()) != 30 {
		t.Fatalf("%d arrivals of %d jobs, want 30 jobs once each", len(a), len(ds.Keys()))
	}
	downstreamtest.CheckWindows(t, a, 50*time.Millisecond, 1)
}
