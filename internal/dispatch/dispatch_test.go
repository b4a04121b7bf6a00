package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

type arrival struct {
	at     time.Time
	header http.Header
	body   string
}

// recorder is a downstream that records when each request arrives.
type recorder struct {
	mu       sync.Mutex
	arrivals []arrival
	answer   func(w http.ResponseWriter, r *http.Request)
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.arrivals = append(rec.arrivals, arrival{at, r.Header.Clone(), string(body)})
	rec.mu.Unlock()
	if rec.answer != nil {
		rec.answer(w, r)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (rec *recorder) all() []arrival {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]arrival(nil), rec.arrivals...)
}

func newDispatcher(t *testing.T, url string, r Route) *Dispatcher {
	t.Helper()
	r.URL = url
	r.Downstream = "test"
	r.Timeout = cmp.Or(r.Timeout, 2*time.Second)
	r.MaxAttempts = cmp.Or(r.MaxAttempts, 5)
	if r.Policy.Interval == 0 {
		r.Policy = leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1, Capacity: 10}
	}
	client := NewClient(16)
	t.Cleanup(client.CloseIdleConnections)
	return New(Options{Routes: func(string) Route { return r }, Client: client})
}

// job is a job on its attempt-th attempt, all earlier ones failed.
func job(id string, attempt int, slot time.Time) queue.Job {
	return queue.Job{ID: id, Tenant: "acme", Payload: json.RawMessage(`{"to":"+15550100","text":"hi"}`), Attempts: attempt, Failures: attempt - 1, DispatchAt: slot}
}

const jobID = "01knb4s3vq5m8h7xkq2d9e4c1a"

func TestRequestShape(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	d := newDispatcher(t, srv.URL+"/send", Route{})
	slot := time.Now().Add(30 * time.Millisecond)
	out := d.Handle(context.Background(), job(jobID, 2, slot))
	if out.Result != queue.Succeeded || out.Status != 200 || out.SentAt.Before(slot) {
		t.Fatalf("outcome %+v", out)
	}
	a := rec.all()
	if len(a) != 1 {
		t.Fatalf("%d arrivals", len(a))
	}
	h := a[0].header
	if h.Get("Idempotency-Key") != jobID || h.Get("X-Throttler-Tenant") != "acme" || h.Get("X-Throttler-Attempt") != "2" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", h)
	}
	if a[0].body != `{"to":"+15550100","text":"hi"}` {
		t.Fatalf("body %q", a[0].body)
	}
	if a[0].at.Before(slot) {
		t.Fatalf("arrived %v before its slot", slot.Sub(a[0].at))
	}
}

func TestClassification(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		answer    func(w http.ResponseWriter, r *http.Request)
		attempt   int
		result    queue.Result
		status    int
		errHas    string
		waitAtMin time.Duration
		waitAtMax time.Duration
		pause     bool // pushback: the tenant pauses until NotBefore
	}{
		{"2xx succeeds", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }, 1, queue.Succeeded, 204, "", 0, 0, false},
		{"400 fails at once with the body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			io.WriteString(w, `{"error":"invalid phone number"}`)
		}, 1, queue.Failed, 400, `400 Bad Request: {"error":"invalid phone number"}`, 0, 0, false},
		{"500 retries with backoff", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, 1, queue.Retry, 500, "500 Internal Server Error", 0, time.Second, false},
		{"500 backoff grows", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) }, 3, queue.Retry, 502, "502", 0, 4 * time.Second, false},
		{"429 honours Retry-After seconds", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
		}, 1, queue.Retry, 429, "429 Too Many Requests", 2 * time.Second, 2 * time.Second, true},
		{"429 without Retry-After pauses for a backoff", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(429) }, 1, queue.Retry, 429, "429", 0, time.Second, true},
		{"429 on the last attempt still waits: pushback is not failure", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(429)
		}, 5, queue.Retry, 429, "429", time.Second, time.Second, true},
		{"503 without Retry-After is a failure", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }, 1, queue.Retry, 503, "503", 0, time.Second, false},
		{"503 honours Retry-After date", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat)) // whole seconds: 2 to 3 s away
			w.WriteHeader(503)
		}, 1, queue.Retry, 503, "503", 1 * time.Second, 3 * time.Second, true},
		{"redirect is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.2:1/elsewhere", http.StatusFound)
		}, 1, queue.Failed, 302, "not followed", 0, 0, false},
		{"last attempt fails", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, 5, queue.Failed, 500, "gave up after 5 failed attempts", 0, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(&recorder{answer: c.answer})
			defer srv.Close()
			d := newDispatcher(t, srv.URL, Route{})
			before := time.Now()
			out := d.Handle(context.Background(), job(jobID, c.attempt, before))
			if out.Result != c.result || out.Status != c.status || !strings.Contains(out.Error, c.errHas) {
				t.Fatalf("outcome %+v, want result %v status %d error containing %q", out, c.result, c.status, c.errHas)
			}
			if c.result == queue.Retry {
				wait := out.NotBefore.Sub(before)
				if wait < c.waitAtMin-50*time.Millisecond || wait > c.waitAtMax+time.Second {
					t.Fatalf("retry after %v, want %v..%v", wait, c.waitAtMin, c.waitAtMax)
				}
				if paused := !out.PauseUntil.IsZero(); paused != c.pause || (paused && !out.PauseUntil.Equal(out.NotBefore)) {
					t.Fatalf("PauseUntil %v with NotBefore %v; want a pause: %v", out.PauseUntil, out.NotBefore, c.pause)
				}
			}
		})
	}
}

func TestTimeoutAndConnectionErrorsRetry(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	d := newDispatcher(t, slow.URL, Route{Timeout: 100 * time.Millisecond})
	start := time.Now()
	out := d.Handle(context.Background(), job(jobID, 1, start))
	if out.Result != queue.Retry || !strings.Contains(out.Error, "timeout after 100ms") {
		t.Fatalf("timeout outcome %+v", out)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("timeout took %v", took)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	d = newDispatcher(t, "http://"+addr+"/", Route{})
	out = d.Handle(context.Background(), job(jobID, 1, time.Now()))
	if out.Result != queue.Retry || !strings.Contains(out.Error, "connection error") {
		t.Fatalf("refused outcome %+v", out)
	}
}

func TestHugeResponseIsReadOnlyUpToTheCap(t *testing.T) {
	t.Parallel()
	var written atomic.Int64
	stopped := make(chan struct{}) // the server stopped writing
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(stopped)
		w.WriteHeader(400)
		chunk := make([]byte, 32<<10)
		for i := 0; i < (1<<30)/len(chunk); i++ { // 1 GB if anyone reads it
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	d := newDispatcher(t, srv.URL, Route{})
	out := d.Handle(context.Background(), job(jobID, 1, time.Now()))
	if out.Result != queue.Failed || len(out.Error) > 1024 {
		t.Fatalf("outcome %v, error of %d bytes", out.Result, len(out.Error))
	}
	// The server stops once the connection is closed, its socket buffers
	// full: far below 1 GB.
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatalf("the server still writes after %d bytes: the body is being read", written.Load())
	}
	if n := written.Load(); n > 64<<20 {
		t.Fatalf("server wrote %d bytes: the body was read past the cap", n)
	}
}

func TestStoppedBeforeSendingReleasesTheJob(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	d := newDispatcher(t, srv.URL, Route{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if out := d.Handle(ctx, job(jobID, 1, time.Now())); out.Result != queue.Released {
		t.Fatalf("outcome %+v", out)
	}
	if n := len(rec.all()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

// Jobs handed over early are written at their slots, spaced by the rate,
// even on cold connections (each job here dials its own).
//
// Not parallel: timing is measured on a machine doing nothing else.
func TestPacingSeenAtTheDownstream(t *testing.T) {
	ds := downstreamtest.New(t)
	T := 20 * time.Millisecond
	d := newDispatcher(t, ds.URL, Route{Policy: leaky.Policy{Interval: T, Burst: 1, Capacity: 100}})
	sendThirtyPaced(t, d, ds, T, time.Now().Add(50*time.Millisecond))
}

// sendThirtyPaced hands d 30 jobs of one tenant, due T apart from start,
// each from a goroutine of its own (in any order), and checks their
// arrivals at ds: each at or after its slot, none closer than the window
// rule allows.
func sendThirtyPaced(t *testing.T, d *Dispatcher, ds *downstreamtest.Server, T time.Duration, start time.Time) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := jobID[:24] + string(rune('a'+i/10)) + string(rune('a'+i%10))
			if out := d.Handle(context.Background(), job(id, 1, start.Add(time.Duration(i)*T))); out.Result != queue.Succeeded {
				t.Errorf("job %d: %+v", i, out)
			}
		}()
	}
	wg.Wait()
	a := ds.All()
	if len(a) != 30 {
		t.Fatalf("%d arrivals, want 30", len(a))
	}
	if testutil.Race {
		t.Skip("spacing is checked without -race")
	}
	downstreamtest.CheckWindows(t, a, T, 1)
	for i, x := range a {
		if x.At.Before(start.Add(time.Duration(i) * T)) {
			t.Fatalf("arrival %d before its slot", i)
		}
	}
}

// roundTrip answers as http.Client.Do would for the clients of NewClient:
// a redirect is the answer (tested above), and an error is the same
// *url.Error, with the same message, as the job's last error shows it.
func TestRoundTripErrorsAsDoWould(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := "http://" + l.Addr().String() + "/send?x=1"
	l.Close() // refused from now on
	cl := NewClient(1)
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		viaDo, _ := http.NewRequest(method, target, strings.NewReader("{}"))
		viaRT, _ := http.NewRequest(method, target, strings.NewReader("{}"))
		_, doErr := cl.Do(viaDo)
		_, rtErr := roundTrip(cl, viaRT)
		var ue *url.Error
		if doErr == nil || rtErr == nil || !errors.As(rtErr, &ue) || rtErr.Error() != doErr.Error() {
			t.Errorf("%s: roundTrip's error %v, Do's %v: want the same *url.Error", method, rtErr, doErr)
		}
	}
}
