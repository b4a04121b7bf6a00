package asynqhandler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/handler/asynqhandler"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// An *asynq.ServeMux with two task types and a logging middleware runs
// unchanged behind a downstream: each job reaches the handler of its
// type, through the middleware, with its payload; SkipRetry ends a job
// failed at once, RevokeTask cancelled, another error is retried.
func TestServeMuxRunsUnchanged(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var logged []string
	seen := map[string][]string{} // type -> payloads
	attempts := map[string]int{}
	mux := asynq.NewServeMux()
	mux.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			err := next.ProcessTask(ctx, task)
			mu.Lock()
			logged = append(logged, fmt.Sprintf("%s err=%v", task.Type(), err))
			mu.Unlock()
			return err
		})
	})
	handle := func(ctx context.Context, task *asynq.Task) error {
		var p struct{ To, Do string }
		if err := json.Unmarshal(task.Payload(), &p); err != nil {
			return fmt.Errorf("bad payload: %v: %w", err, asynq.SkipRetry)
		}
		job, _ := handler.JobFromContext(ctx)
		mu.Lock()
		seen[task.Type()] = append(seen[task.Type()], p.To)
		attempts[p.To]++
		n := attempts[p.To]
		mu.Unlock()
		if _, ok := asynq.GetTaskID(ctx); ok || job == nil || job.Tenant != "acme" {
			return errors.New("the context is not as the adapter documents it")
		}
		switch p.Do {
		case "skip":
			return fmt.Errorf("number blocked: %w", asynq.SkipRetry)
		case "revoke":
			return asynq.RevokeTask
		case "flaky":
			if n == 1 {
				return errors.New("vendor busy")
			}
		}
		return nil
	}
	mux.HandleFunc("email:welcome", handle)
	mux.HandleFunc("sms:otp", handle)
	hm := handler.NewMux()
	hm.Handle("tasks", asynqhandler.New(mux))
	base := start(t, `
[downstreams.tasks]
handler = "tasks"
max_attempts = 3
[tenant_defaults]
downstream = "tasks"
rate = "50/s"
`, hm)
	jobs := []struct{ typ, to, do, want string }{
		{"email:welcome", "a@x", "", "succeeded"},
		{"sms:otp", "+1", "", "succeeded"},
		{"sms:otp", "+2", "flaky", "succeeded"},
		{"email:welcome", "b@x", "skip", "failed"},
		{"sms:otp", "+3", "revoke", "cancelled"},
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		status, out := post(t, base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"type": %q, "payload": {"To": %q, "Do": %q}}`, j.typ, j.to, j.do))
		if status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %v", status, out)
		}
		ids[i] = out["id"].(string)
	}
	for i, j := range jobs {
		var got map[string]any
		testutil.WaitFor(t, 10*time.Second, j.to+" ends "+j.want, func() bool {
			_, got = get(t, base+"/v1/jobs/"+ids[i])
			return got["state"] == j.want
		})
		if j.do == "skip" && got["attempts"].(float64) != 1 {
			t.Fatalf("SkipRetry: %v attempts, want 1", got["attempts"])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen["email:welcome"]) != 2 || len(seen["sms:otp"]) != 4 || attempts["+2"] != 2 {
		t.Fatalf("handled by type %v, attempts %v", seen, attempts)
	}
	if len(logged) != 6 {
		t.Fatalf("the middleware logged %d calls, want 6: %v", len(logged), logged)
	}
}

// A job without a type is a task of its downstream's name.
func TestTypeDefaultsToTheDownstream(t *testing.T) {
	t.Parallel()
	types := make(chan string, 1)
	h := asynqhandler.New(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		types <- task.Type()
		if task.ResultWriter() != nil {
			return errors.New("a ResultWriter outside asynq's server")
		}
		return nil
	}))
	if _, err := h.Handle(context.Background(), &handler.Job{Downstream: "mail", Payload: []byte(`{}`)}); err != nil || <-types != "mail" {
		t.Fatal(err)
	}
	kind, _ := handler.Decide(errorOf(h, fmt.Errorf("wrapped: %w", asynq.SkipRetry)))
	if kind != handler.Failed {
		t.Fatalf("a wrapped SkipRetry decides %v, want failed", kind)
	}
}

func errorOf(_ handler.Handler, err error) error {
	_, e := asynqhandler.New(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return err })).Handle(context.Background(), &handler.Job{Type: "x"})
	return e
}

// start runs the service with mux on an embedded store in the test's
// directory until the test ends, and returns the API's base URL.
func start(t *testing.T, body string, mux *handler.Mux) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"5s\"\n[store]\npath = %q\n%s", filepath.Join(dir, "t.db"), body)
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- handler.Run(ctx, handler.Options{ConfigFile: file, Handlers: mux, Logger: testLogger(t), Started: func(a string) { addr <- a }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("handler.Run: %v", err)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("handler.Run: %v", err)
	}
	return ""
}

func post(t *testing.T, url, body string) (int, map[string]any) { return do(t, "POST", url, body) }
func get(t *testing.T, url string) (int, map[string]any)        { return do(t, "GET", url, "") }

func do(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// The task is built and a ServeMux's routing and middleware chain are
// put together in Prepare, before the slot; the function it returns runs
// only the handler's own chain (the middleware's body, then the handler).
func TestServeMuxIsRoutedBeforeTheSlot(t *testing.T) {
	t.Parallel()
	var events []string
	mux := asynq.NewServeMux()
	mux.Use(func(next asynq.Handler) asynq.Handler {
		events = append(events, "chained")
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			events = append(events, "middleware")
			return next.ProcessTask(ctx, task)
		})
	})
	mux.HandleFunc("sms:otp", func(ctx context.Context, task *asynq.Task) error {
		events = append(events, "handler "+string(task.Payload()))
		return nil
	})
	p, ok := asynqhandler.New(mux).(handler.Preparer)
	if !ok {
		t.Fatal("the adapter is not a handler.Preparer")
	}
	run := p.Prepare(context.Background(), &handler.Job{Type: "sms:otp", Payload: []byte(`{"to":"1"}`)})
	if fmt.Sprint(events) != "[chained]" {
		t.Fatalf("after Prepare: %v, want the chain built and nothing run", events)
	}
	if _, err := run(); err != nil {
		t.Fatal(err)
	}
	if want := `[chained middleware handler {"to":"1"}]`; fmt.Sprint(events) != want {
		t.Fatalf("after the call: %v, want %v", events, want)
	}
}

// A job whose type no handler of the ServeMux knows can never succeed:
// where the process has the handler it is refused at admission (422
// unknown_type, nothing queued; in a batch, that job alone), and one that
// reaches the handler anyway (enqueued through a process without it)
// fails at once, not retried max_attempts times.
func TestUnknownTypeIsRefusedOrFailsAtOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	mux := asynq.NewServeMux()
	mux.HandleFunc("email:", func(context.Context, *asynq.Task) error { calls.Add(1); return nil })
	hm := handler.NewMux()
	hm.Handle("tasks", asynqhandler.New(mux))
	base := start(t, `
[downstreams.tasks]
handler = "tasks"
max_attempts = 5
[tenant_defaults]
downstream = "tasks"
rate = "50/s"
`, hm)
	for _, body := range []string{`{"type": "sms:otp", "payload": 1}`, `{"payload": 1}`} {
		status, out := post(t, base+"/v1/tenants/acme/jobs", body)
		if msg, _ := out["message"].(string); status != http.StatusUnprocessableEntity || out["error"] != "unknown_type" || out["part"] != "type" || !strings.Contains(msg, `"tasks"`) {
			t.Fatalf("enqueue %s: %d %v, want 422 unknown_type naming the handler", body, status, out)
		}
	}
	status, out := post(t, base+"/v1/tenants/acme/jobs:batch", `{"jobs": [{"type": "email:welcome", "payload": 1}, {"type": "sms:otp", "payload": 2}]}`)
	results, _ := out["results"].([]any)
	if status != http.StatusOK || len(results) != 2 || results[0].(map[string]any)["status"] != 202.0 || results[1].(map[string]any)["error"] != "unknown_type" {
		t.Fatalf("batch: %d %v, want the known type admitted and the other refused", status, out)
	}
	if _, ten := get(t, base+"/v1/tenants/acme"); ten["accepted_total"] != 1.0 {
		t.Fatalf("tenant %v, want the one job of a known type accepted", ten)
	}
	testutil.WaitFor(t, 10*time.Second, "the known type handled", func() bool { return calls.Load() == 1 })

	h := asynqhandler.New(mux)
	typed, ok := h.(handler.Typed)
	if !ok || !typed.Handles("tasks", "email:welcome") || typed.Handles("tasks", "sms:otp") || typed.Handles("tasks", "") {
		t.Fatalf("the adapter of a ServeMux as handler.Typed: %v", ok)
	}
	_, err := h.Handle(context.Background(), &handler.Job{Downstream: "tasks", Type: "sms:otp", Payload: []byte(`1`)})
	if kind, _ := handler.Decide(err); kind != handler.Failed || !strings.Contains(fmt.Sprint(err), `"sms:otp"`) {
		t.Fatalf("a job of an unknown type handled anyway: %v (%v), want it failed at once, naming the type", err, kind)
	}
	if anyType, ok := asynqhandler.New(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })).(handler.Typed); ok && !anyType.Handles("tasks", "sms:otp") {
		t.Fatal("a plain asynq.Handler takes every type")
	}
}
