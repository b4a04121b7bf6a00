package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Callbacks to the producer (DESIGN.md section 6b), end to end:
// through a receiver that is down for 10 s, and across a kill -9 between
// a job's end and its callback. The receivers verify each signature with
// implementations of the Standard Webhooks scheme that are not the code
// that signs: the example program of docs/callbacks.md, and verifyWebhook below.

// newHookSecret is a Standard Webhooks secret, "whsec_" and 32 random
// bytes in base64, written to a file of the test's (as a deployment
// would give it).
func newHookSecret(t *testing.T) (secret, file string) {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	secret = "whsec_" + base64.StdEncoding.EncodeToString(key)
	file = filepath.Join(t.TempDir(), "callback-secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secret, file
}

// freeLoopbackAddr is a loopback host:port nothing listens on: a
// connection to it is refused until something does.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

var (
	receiverOnce sync.Once
	receiverBin  string
	receiverErr  error
)

// receiverBinary builds examples/callback-receiver once.
func receiverBinary(t *testing.T) string {
	t.Helper()
	receiverOnce.Do(func() {
		dir := filepath.Dir(throttlerBinary(t)) // removed with it by TestMain
		receiverBin = filepath.Join(dir, "callback-receiver")
		if out, err := exec.Command("go", "build", "-o", receiverBin, "../../examples/callback-receiver").CombinedOutput(); err != nil {
			receiverErr = fmt.Errorf("go build examples/callback-receiver: %v\n%s", err, out)
		}
	})
	if receiverErr != nil {
		t.Fatal(receiverErr)
	}
	return receiverBin
}

// hookEvent is one callback the example receiver accepted (a line it
// prints).
type hookEvent struct {
	WebhookID string `json:"webhook_id"`
	Type      string `json:"type"`
	Job       string `json:"job"`
	Tenant    string `json:"tenant"`
	State     string `json:"state"`
	Repeat    bool   `json:"repeat"`
}

// exampleReceiver is the example receiver of docs/callbacks.md, running.
type exampleReceiver struct {
	mu     sync.Mutex
	events []hookEvent
	stderr strings.Builder
}

// startReceiver runs examples/callback-receiver on addr with secret until
// the test ends, once it listens.
func startReceiver(t *testing.T, addr, secret string) *exampleReceiver {
	t.Helper()
	r := &exampleReceiver{}
	cmd := exec.Command(receiverBinary(t), "-listen", addr)
	cmd.Env = append(os.Environ(), "THROTTLER_CALLBACK_SECRET="+secret)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.stderr.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev hookEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				r.mu.Lock()
				r.events = append(r.events, ev)
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	testutil.WaitFor(t, 10*time.Second, "the receiver listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return r
}

func (r *exampleReceiver) got() []hookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]hookEvent(nil), r.events...)
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The receiver refuses connections for 10 s while 50 jobs finish, then
// comes back: every callback arrives (verified by the example receiver),
// a repeat with the same webhook-id (the callback's own, not the job id),
// and the jobs' sends to the vendor kept their spacing meanwhile.
func TestCallbacksReachTheProducerThroughAnOutage(t *testing.T) {
	testutil.SkipShort(t, "process test: the throttler binary and the callback receiver, through an outage of the producer")
	t.Parallel()
	for _, backend := range []string{"embedded", "redis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			callbacksThroughAnOutage(t, backend)
		})
	}
}

func callbacksThroughAnOutage(t *testing.T, backend string) {
	ds := downstreamtest.New(t)
	secret, secretFile := newHookSecret(t)
	addr := freeLoopbackAddr(t)
	const T = 50 * time.Millisecond
	body := fmt.Sprintf(`[tenant_defaults]
rate = "20/s"
capacity = 100
[tenants.shop]
callback_url = "http://%[1]s/hooks/shop"
[callbacks]
signing_secret_file = %[2]q
allow = ["http://%[1]s/hooks/"]
timeout = "1s"
min_backoff = "100ms"
max_backoff = "1s"
max_attempts = 100
`, addr, secretFile)
	file := writeConfig(t, body, ds)
	if backend == "redis" {
		file = redisConfig(t, redistest.Start(t, false).URL(), "standalone", body, ds)
	}
	p := startProcess(t, file)

	const n = 50
	down := time.Now()
	ids := make([]string, n)
	for i := range ids {
		st, _, body := call(t, "POST", p.base+"/v1/tenants/shop/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != http.StatusAccepted {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		ids[i] = body["id"].(string)
	}
	waitAllSucceeded(t, p.base, ids, 20*time.Second)
	for _, id := range ids {
		cb, _ := jobState(t, p.base, id)["callback"].(map[string]any)
		if cb == nil || cb["state"] != "pending" {
			t.Fatalf("job %s ended with the receiver down: callback %v, want pending", id, cb)
		}
	}
	cb, _ := jobState(t, p.base, ids[0])["callback"].(map[string]any)
	if last, _ := cb["last_error"].(string); cb["attempts"].(float64) < 1 || !strings.Contains(last, "refused") {
		t.Errorf("the first job's callback after a refused attempt: %v, want its attempts and the refusal", cb)
	}
	downstreamtest.CheckWindows(t, ds.Of("shop"), T, 1)

	arriveAt(down.Add(10 * time.Second))
	rcv := startReceiver(t, addr, secret)
	back := time.Now()
	testutil.WaitFor(t, 15*time.Second, "every job's callback", func() bool {
		seen := map[string]bool{}
		for _, ev := range rcv.got() {
			seen[ev.Job] = true
		}
		return len(seen) == n
	})
	t.Logf("every callback within %v of the receiver coming back", time.Since(back).Round(time.Millisecond))
	repeats := checkHookEvents(t, rcv.got())
	testutil.WaitFor(t, 10*time.Second, "every callback recorded delivered", func() bool {
		for _, id := range ids {
			if cb, _ := jobState(t, p.base, id)["callback"].(map[string]any); cb["state"] != "delivered" || cb["last_error"] != nil {
				return false
			}
		}
		return true
	})
	t.Logf("%d callbacks accepted by the receiver, %d of them repeats", len(rcv.got()), repeats)

	// The vendor saw each job once, spaced, while the callbacks waited.
	if got := ds.Of("shop"); len(got) != n {
		t.Fatalf("the vendor saw %d requests, want %d", len(got), n)
	}
	downstreamtest.CheckWindows(t, ds.Of("shop"), T, 1)
	// The sender counts an attempt once its record is written: a moment
	// after the job says delivered.
	var metrics []byte
	delivered := `throttler_callbacks_total{outcome="delivered"} ` + strconv.Itoa(n) + "\n"
	testutil.WaitFor(t, 10*time.Second, "every callback counted delivered", func() bool {
		_, _, metrics = send(t, "GET", p.base+"/metrics", "")
		return strings.Contains(string(metrics), delivered)
	})
	for _, want := range []string{`throttler_callbacks_total{outcome="failed"} 0`} {
		if !strings.Contains(string(metrics), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.Contains(string(metrics), `throttler_callbacks_total{outcome="retry"}`) || strings.Contains(string(metrics), `throttler_callbacks_total{outcome="retry"} 0`+"\n") {
		t.Errorf("metrics count no retried callback")
	}
	// The secret is in no log line and no answer.
	key := strings.TrimPrefix(secret, "whsec_")
	if strings.Contains(p.logs(), key) || strings.Contains(string(metrics), key) {
		t.Error("the callback secret reached the log or the metrics")
	}
	if _, _, raw := send(t, "GET", p.base+"/v1/jobs/"+ids[0], ""); strings.Contains(string(raw), key) {
		t.Error("the callback secret reached a job's answer")
	}
}

// checkHookEvents checks the callbacks a receiver took, each of a job of
// shop that succeeded, and returns how many were repeats: each job's
// callback has one webhook-id on every attempt, its own, not the job id.
func checkHookEvents(t *testing.T, events []hookEvent) (repeats int) {
	t.Helper()
	hookIDs := map[string]string{} // job -> its callback's webhook-id
	for _, ev := range events {
		if ev.WebhookID == "" || ev.WebhookID == ev.Job || ev.Type != "job.succeeded" || ev.State != "succeeded" || ev.Tenant != "shop" {
			t.Errorf("callback %+v, want a webhook-id of its own (not the job id) and job.succeeded", ev)
		}
		if id, ok := hookIDs[ev.Job]; ok && id != ev.WebhookID {
			t.Errorf("job %s's callback came with webhook-ids %s and %s, want one", ev.Job, id, ev.WebhookID)
		}
		hookIDs[ev.Job] = ev.WebhookID
		if ev.Repeat {
			repeats++
		}
	}
	return repeats
}

// kill -9 between a job's end and its callback's answer (the receiver
// holds the first attempt): after the restart the callback is sent again,
// the same webhook-id, and recorded delivered.
func TestCallbackOwedSurvivesKill9(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 and restart of the throttler binary")
	t.Parallel()
	ds := downstreamtest.New(t)
	secret, secretFile := newHookSecret(t)
	type hook struct {
		id  string
		err error
	}
	hooks := make(chan hook, 10)
	release := make(chan struct{})
	var first sync.Once
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hooks <- hook{r.Header.Get("webhook-id"), verifyWebhook(secret, r.Header, body, time.Now())}
		held := false
		first.Do(func() { held = true })
		if held { // the first attempt gets no answer: the process dies meanwhile
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	defer close(release)
	file := writeConfig(t, fmt.Sprintf(`[callbacks]
signing_secret_file = %q
allow = [%q]
timeout = "1s"
`, secretFile, recv.URL+"/"), ds)
	p := startProcess(t, file)
	st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", `{"payload":{"otp":"123456"},"callback_url":"`+recv.URL+`/hooks/otp"}`)
	if st != http.StatusAccepted {
		t.Fatalf("%d %v", st, body)
	}
	id := body["id"].(string)
	var h hook
	select {
	case h = <-hooks:
	case <-time.After(10 * time.Second):
		t.Fatal("no callback within 10 s of the job")
	}
	if h.id == "" || h.id == id || h.err != nil {
		t.Fatalf("the first callback: webhook-id %s (%v), want one of its own (not the job id %s), verified", h.id, h.err, id)
	}
	firstID := h.id
	p.kill9(t)
	p = startProcess(t, file)
	select {
	case h = <-hooks:
	case <-time.After(20 * time.Second):
		t.Fatal("no callback within 20 s of the restart")
	}
	if h.id != firstID || h.err != nil {
		t.Fatalf("the callback after the restart: webhook-id %s (%v), want %s again, verified", h.id, h.err, firstID)
	}
	testutil.WaitFor(t, 5*time.Second, "the callback recorded delivered", func() bool {
		cb, _ := jobState(t, p.base, id)["callback"].(map[string]any)
		return cb["state"] == "delivered" && cb["attempts"] == 1.0
	})
	if got := ds.Of("acme"); len(got) != 1 {
		t.Fatalf("the vendor saw %d requests, want 1", len(got))
	}
}

// verifyWebhook is a Standard Webhooks receiver's check written from the
// specification, apart from the signer (and from the example's).
func verifyWebhook(secret string, h http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return errors.New("webhook-id or webhook-timestamp missing or stale")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(h.Get("Webhook-Signature")) {
		v, b64, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if v == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	var ev struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &ev)
	return fmt.Errorf("no valid signature on a %s callback", ev.Type)
}
