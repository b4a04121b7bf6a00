package queuetest

import (
	"context"
	"encoding/json"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Requests and answers: what a job asks of its downstream's request is kept
// with it and handed over; the answer to its latest attempt is kept with it
// and shown (DESIGN.md section 6a), on every outcome that carries one, and
// across a restart.

// refund is a job's request as a Stripe refund asks it.
var refund = &queue.JobRequest{Method: "POST", Path: "/v1/refunds",
	Query: queue.Query{"expand[]": {"charge", "payment_intent"}}, Headers: map[string]string{"Stripe-Account": "acct_1"}}

// answers are the answers the test's downstream gives, one kind each: a
// success, a permanent failure (with a body cut short, not UTF-8), a
// failure retried, and a pushback.
var answers = map[string]*queue.Response{
	"ok": {Status: 201, Headers: map[string]string{"Content-Type": "application/json", "X-Request-Id": "req_1"},
		Body: `{"sid":"SM0123"}`},
	"declined": {Status: 402, Headers: map[string]string{"Content-Type": "application/octet-stream"},
		BodyBase64: "/wD+", Truncated: true},
	"retried": {Status: 503, Headers: map[string]string{}, Body: "busy"},
	"pushed":  {Status: 429, Headers: map[string]string{"Retry-After": "3600"}, Body: `{"error":"slow down"}`},
}

// answer is the outcome that gives the answer of kind.
func answer(clk interface{ Now() time.Time }, kind string) queue.Outcome {
	now := clk.Now()
	r := answers[kind]
	o := queue.Outcome{SentAt: now, Status: r.Status, Error: kind, Response: r}
	switch kind {
	case "ok":
		o.Result, o.Error = queue.Succeeded, ""
	case "declined":
		o.Result = queue.Failed
	case "retried":
		o.Result, o.NotBefore = queue.Retry, now.Add(time.Hour)
	case "pushed":
		o.Result, o.NotBefore, o.PauseUntil = queue.Retry, now.Add(time.Hour), now.Add(time.Hour)
	}
	return o
}

func testRequestsAndAnswersAreKept(t *testing.T, d Driver) {
	clk, s, reopen := d.startWith(t, Config{Policy: Leaky20(10)})
	ctx := context.Background()
	kinds := []string{"ok", "declined", "retried", "pushed"}
	ids := map[string]string{} // kind -> job id
	for _, kind := range kinds {
		tenant := "acme"
		if kind == "pushed" {
			tenant = "other" // its pause holds only its own tenant
		}
		nj := Payload(len(ids))
		if kind != "ok" {
			nj.Request = refund
		}
		a := EnqueueOne(t, s, tenant, nj)
		if !a.Admitted() || !reflect.DeepEqual(a.Job.Request, nj.Request) {
			t.Fatalf("%s: admission %+v, want its request %+v", kind, a, nj.Request)
		}
		ids[kind] = a.Job.ID
		if j, err := s.Job(ctx, a.Job.ID); err != nil || !reflect.DeepEqual(j.Request, nj.Request) || j.Response != nil {
			t.Fatalf("%s waiting: %+v %v, want its request and no answer", kind, j, err)
		}
	}
	kindOf := map[string]string{}
	for kind, id := range ids {
		kindOf[id] = kind
	}
	var mu sync.Mutex
	requests := map[string]*queue.JobRequest{}
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(_ context.Context, j queue.Job) queue.Outcome {
		mu.Lock()
		requests[j.ID] = j.Request
		mu.Unlock()
		return answer(clk, kindOf[j.ID])
	})
	for range kinds {
		WaitHanded(t, clk, got, 5*time.Millisecond)
	}
	WaitState(t, s, ids["ok"], queue.StateSucceeded)
	WaitState(t, s, ids["declined"], queue.StateFailed)
	WaitState(t, s, ids["retried"], queue.StateRetrying)
	WaitState(t, s, ids["pushed"], queue.StateRetrying)
	stop()
	mu.Lock()
	for _, kind := range kinds {
		want := refund
		if kind == "ok" {
			want = nil
		}
		if r := requests[ids[kind]]; !reflect.DeepEqual(r, want) {
			t.Fatalf("%s handed over with request %+v, want %+v", kind, r, want)
		}
	}
	mu.Unlock()
	checkAnswers(t, s, ids, kinds, "after the attempts")

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen()
	checkAnswers(t, s, ids, kinds, "after a restart")

	// The next attempt's answer replaces the one before.
	got, stop = HandOver(t, s, clk, 10*time.Millisecond, 10, func(_ context.Context, j queue.Job) queue.Outcome {
		return answer(clk, "ok")
	})
	clk.Advance(time.Hour)
	for range 2 {
		WaitHanded(t, clk, got, 5*time.Millisecond)
	}
	WaitState(t, s, ids["retried"], queue.StateSucceeded)
	WaitState(t, s, ids["pushed"], queue.StateSucceeded)
	stop()
	for _, kind := range []string{"retried", "pushed"} {
		if j, _ := s.Job(ctx, ids[kind]); !reflect.DeepEqual(j.Response, answers["ok"]) || !reflect.DeepEqual(j.Request, refund) {
			t.Fatalf("%s after its next attempt: answer %s request %+v, want the new answer and its request", kind, show(j.Response), j.Request)
		}
	}
}

// checkAnswers checks that each job of kinds shows its request and the
// answer of its latest attempt, and the failed one is listed with it.
func checkAnswers(t *testing.T, s queue.Store, ids map[string]string, kinds []string, when string) {
	t.Helper()
	ctx := context.Background()
	for _, kind := range kinds {
		j, err := s.Job(ctx, ids[kind])
		if err != nil {
			t.Fatalf("%s %s: %v", kind, when, err)
		}
		if !reflect.DeepEqual(j.Response, answers[kind]) {
			t.Fatalf("%s %s: answer %s, want %s", kind, when, show(j.Response), show(answers[kind]))
		}
		if kind != "ok" && !reflect.DeepEqual(j.Request, refund) {
			t.Fatalf("%s %s: request %+v, want %+v", kind, when, j.Request, refund)
		}
	}
	failed, err := s.Failed(ctx, "acme", 10)
	if err != nil || len(failed) != 1 || !reflect.DeepEqual(failed[0].Response, answers["declined"]) {
		t.Fatalf("failed jobs %s: %+v %v, want the declined one with its answer", when, failed, err)
	}
}

func show(r *queue.Response) string {
	b, _ := json.Marshal(r)
	return string(b)
}
