package callback

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/secret"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memStore is a Store in memory: one job's callback.
type memStore struct {
	mu       sync.Mutex
	job      queue.Job
	attempts []queue.CallbackAttempt
	taken    int
}

func (m *memStore) DueCallbacks(_ context.Context, limit int, lease time.Duration) ([]queue.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.job.CallbackStatus
	if st.State != queue.CallbackPending || st.NextAt.After(time.Now()) || limit < 1 {
		return nil, nil
	}
	m.taken++
	st.NextAt = time.Now().Add(lease)
	j := m.job
	c := *st
	j.CallbackStatus = &c
	return []queue.Job{j}, nil
}

func (m *memStore) CallbackAttempted(_ context.Context, id string, a queue.CallbackAttempt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attempts = append(m.attempts, a)
	st := m.job.CallbackStatus
	st.Attempts++
	switch {
	case a.Delivered:
		st.State = queue.CallbackDelivered
	case a.Retry.IsZero():
		st.State = queue.CallbackFailed
	default:
		st.NextAt = a.Retry
	}
	return nil
}

func (m *memStore) recorded() []queue.CallbackAttempt {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]queue.CallbackAttempt(nil), m.attempts...)
}

func signer(t *testing.T) *outbound.Signer {
	t.Helper()
	t.Setenv("TEST_CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	s, err := outbound.CompileSigner("callbacks", secret.Ref{Env: "TEST_CALLBACK_SECRET"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A receiver that fails twice and then takes it: two retries, each after
// a wait under the backoff's ceiling, then delivered; the body and the
// signature's headers as the receiver sees them.
func TestSenderRetriesUntilDelivered(t *testing.T) {
	var mu sync.Mutex
	var got []*http.Request
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r)
		n := len(got)
		mu.Unlock()
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	store := &memStore{job: queue.Job{ID: "06h3e8gd38mjxg6fvqndn6rctm", Tenant: "shop", State: queue.StateFailed,
		Callback:       &queue.JobCallback{URL: recv.URL + "/hooks"},
		CallbackStatus: &queue.CallbackStatus{State: queue.CallbackPending}}}
	cfg := config.Callbacks{Allow: []string{recv.URL + "/"}, Timeout: config.Duration(time.Second), MaxAttempts: 5,
		MinBackoff: config.Duration(40 * time.Millisecond), MaxBackoff: config.Duration(time.Second), Concurrency: 2}
	sig := signer(t)
	var outcomes []string
	var omu sync.Mutex
	s := New(Options{Store: store, Live: func() (config.Callbacks, *outbound.Signer) { return cfg, sig },
		Body: func(j queue.Job) ([]byte, error) {
			return json.Marshal(map[string]any{"type": "job." + string(j.State), "id": j.ID})
		},
		Poll:      5 * time.Millisecond,
		Jitter:    func() float64 { return 0.99 },
		OnAttempt: func(o string) { omu.Lock(); outcomes = append(outcomes, o); omu.Unlock() },
	})
	s.Start(context.Background())
	defer s.Stop()
	testutil.WaitFor(t, 5*time.Second, "delivered", func() bool { return len(store.recorded()) == 3 })
	s.Stop()
	rec := store.recorded()
	if rec[0].Delivered || rec[1].Delivered || !rec[2].Delivered || rec[0].Error != "the receiver answered 503" {
		t.Fatalf("attempts %+v, want two failures then a delivery", rec)
	}
	omu.Lock()
	if strings.Join(outcomes, " ") != "retry retry delivered" {
		t.Errorf("outcomes %v", outcomes)
	}
	omu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	// Full jitter under a ceiling of 40 ms, then 80 ms.
	for i, ceiling := range []time.Duration{40 * time.Millisecond, 80 * time.Millisecond} {
		if wait := time.Duration(0.99 * float64(ceiling)); rec[i].Retry.IsZero() {
			t.Fatalf("attempt %d: no retry time (want about %v on)", i+1, wait)
		}
	}
	for _, r := range got {
		if r.Header.Get("Webhook-Id") != MessageID(store.job) || r.Header.Get("Content-Type") != "application/json" ||
			!strings.HasPrefix(r.Header.Get("Webhook-Signature"), "v1,") || r.Method != http.MethodPost {
			t.Fatalf("callback %s %v", r.Method, r.Header)
		}
	}
}

// The backoff: full jitter up to min_backoff doubled per attempt, capped.
func TestBackoff(t *testing.T) {
	cfg := config.Callbacks{MinBackoff: config.Duration(time.Second), MaxBackoff: config.Duration(6 * time.Hour)}
	s := New(Options{Jitter: func() float64 { return 1 }})
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 15: 4*time.Hour + 33*time.Minute + 4*time.Second, 16: 6 * time.Hour, 1000: 6 * time.Hour} {
		if got := s.backoff(cfg, n); got != want {
			t.Errorf("after %d attempts: %v, want %v", n, got, want)
		}
	}
	s = New(Options{Jitter: func() float64 { return 0 }})
	if got := s.backoff(cfg, 3); got != 0 {
		t.Errorf("jitter 0: %v", got)
	}
}

// The last attempt that fails gives up; a URL a reload took out of the
// allow-list is given up without a request.
func TestSenderGivesUp(t *testing.T) {
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	defer recv.Close()
	for _, c := range []struct {
		name, allow, err string
	}{
		{"attempts", recv.URL + "/", "the receiver answered 502"},
		{"allow-list", "https://elsewhere.example/", "no longer in callbacks.allow"},
	} {
		store := &memStore{job: queue.Job{ID: "x", State: queue.StateSucceeded, Callback: &queue.JobCallback{URL: recv.URL + "/h"},
			CallbackStatus: &queue.CallbackStatus{State: queue.CallbackPending, Attempts: 2}}}
		cfg := config.Callbacks{Allow: []string{c.allow}, Timeout: config.Duration(time.Second), MaxAttempts: 3,
			MinBackoff: config.Duration(time.Millisecond), MaxBackoff: config.Duration(time.Millisecond), Concurrency: 1}
		sig := signer(t)
		s := New(Options{Store: store, Live: func() (config.Callbacks, *outbound.Signer) { return cfg, sig },
			Body: func(queue.Job) ([]byte, error) { return []byte("{}"), nil }, Poll: 5 * time.Millisecond})
		s.Start(context.Background())
		testutil.WaitFor(t, 5*time.Second, "an attempt", func() bool { return len(store.recorded()) == 1 })
		s.Stop()
		if a := store.recorded()[0]; a.Delivered || !a.Retry.IsZero() || !strings.Contains(a.Error, c.err) {
			t.Errorf("%s: %+v, want given up with %q", c.name, a, c.err)
		}
	}
}

// A callback carries a webhook-id of its own (Standard Webhooks: one id
// per message): not the job id, which the signed delivery of the same job
// carries, so that a service that is both the vendor and the producer, and
// drops ids it has seen, does not drop the callback. Every attempt of one
// callback carries the same id (a resend is dropped as a repeat); the
// callback of a later end of the job, after a hand retry, carries a new
// one.
func TestCallbackHasAWebhookIDOfItsOwn(t *testing.T) {
	ids := make(chan string, 10)
	fails := 1
	var mu sync.Mutex
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ids <- r.Header.Get("Webhook-Id")
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	end := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	store := &memStore{job: queue.Job{ID: "06h3e8gd38mjxg6fvqndn6rctm", Tenant: "shop", State: queue.StateFailed, FinishedAt: end,
		Callback: &queue.JobCallback{URL: recv.URL + "/hooks"}, CallbackStatus: &queue.CallbackStatus{State: queue.CallbackPending}}}
	cfg := config.Callbacks{Allow: []string{recv.URL + "/"}, Timeout: config.Duration(time.Second), MaxAttempts: 5,
		MinBackoff: config.Duration(time.Millisecond), MaxBackoff: config.Duration(time.Millisecond), Concurrency: 1}
	sig := signer(t)
	s := New(Options{Store: store, Live: func() (config.Callbacks, *outbound.Signer) { return cfg, sig },
		Body: func(queue.Job) ([]byte, error) { return []byte("{}"), nil }, Poll: 5 * time.Millisecond})
	s.Start(context.Background())
	defer s.Stop()
	testutil.WaitFor(t, 5*time.Second, "the first end's callback delivered", func() bool { return len(store.recorded()) == 2 })
	first, again := <-ids, <-ids
	if first == "" || first == store.job.ID || again != first {
		t.Fatalf("the first end's attempts: webhook-id %q then %q, want one id of their own, not the job id %q", first, again, store.job.ID)
	}
	// A hand retry, and the job ends again, later: its callback is owed anew.
	store.mu.Lock()
	store.job.State, store.job.FinishedAt = queue.StateSucceeded, end.Add(3*time.Second)
	store.job.CallbackStatus = &queue.CallbackStatus{State: queue.CallbackPending}
	store.mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, "the second end's callback delivered", func() bool { return len(store.recorded()) == 3 })
	if second := <-ids; second == "" || second == first || second == store.job.ID {
		t.Fatalf("the second end's webhook-id %q: want a new one (the first was %q, the job is %q)", second, first, store.job.ID)
	}
}
