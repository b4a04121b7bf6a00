package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	rl, err := ParseRateLimit(`"leaky";q=1001;w=201, "1000/d";q=1000;w=86400`, `"leaky";r=1000;t=1, "1000/d";  r=999;t=86400;x="y";flag`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Quota{
		{Name: "leaky", Limit: 1001, Window: 201 * time.Second, Remaining: 1000, HasRemaining: true, Reset: time.Second},
		{Name: "1000/d", Limit: 1000, Window: 24 * time.Hour, Remaining: 999, HasRemaining: true, Reset: 24 * time.Hour},
	}
	if fmt.Sprint(rl.Quotas) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", rl.Quotas, want)
	}
	// Tokens name items too; a state without a policy is still read.
	rl, err = ParseRateLimit("", `default;r=0;t=30`)
	if err != nil || len(rl.Quotas) != 1 || rl.Quotas[0].Name != "default" || rl.Quotas[0].Reset != 30*time.Second {
		t.Fatalf("token item: %+v %v", rl, err)
	}
	if rl, err := ParseRateLimit("", ""); err != nil || rl.Known() {
		t.Fatalf("no fields: %+v %v", rl, err)
	}
	for _, bad := range [][2]string{
		{`"a";w=1`, ""},                 // no quota
		{`"a";q=1,`, ""},                // trailing comma
		{`"a;q=1`, ""},                  // unclosed string
		{`"a";q=1.5`, ""},               // not an integer
		{`"a";q=1 "b";q=2`, ""},         // no comma
		{"", `"a";t=1`},                 // no remaining
		{"", `("a" "b");r=1`},           // an inner list
		{`"a";q=12345678901234567`, ""}, // too long
	} {
		if _, err := ParseRateLimit(bad[0], bad[1]); err == nil {
			t.Errorf("%q %q: parsed", bad[0], bad[1])
		}
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	rl := func(policy, state string) RateLimit {
		r, err := ParseRateLimit(policy, state)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		name string
		rl   RateLimit
		n    int64
		wait time.Duration
	}{
		{"unknown", RateLimit{}, -1, 0},
		{"room", rl(`"leaky";q=11;w=11`, `"leaky";r=4;t=1`), 4, 0},
		{"the least room of all", rl(`"leaky";q=11;w=11, "3/m";q=3;w=60`, `"leaky";r=4;t=1, "3/m";r=2;t=60`), 2, 0},
		{"a full bucket: at most one interval", rl(`"leaky";q=6;w=1`, `"leaky";r=0;t=1`), 0, time.Second / 6},
		{"a slow bucket: its reset", rl(`"leaky";q=2;w=120`, `"leaky";r=0;t=60`), 0, time.Minute},
		{"a full window: until its oldest leaves", rl(`"token";q=5;w=1, "3/m";q=3;w=60`, `"token";r=2;t=1, "3/m";r=0;t=42`), 0, 42 * time.Second},
	} {
		if n, wait := c.rl.Next(); n != c.n || wait != c.wait {
			t.Errorf("%s: %d %v, want %d %v", c.name, n, wait, c.n, c.wait)
		}
	}
}

// canned serves fixed answers by path.
func canned(t *testing.T, answers map[string]func(w http.ResponseWriter)) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := answers[r.URL.Path]; ok {
			a(w)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func jsonAnswer(status int, body string, header ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
}

// Each error answer comes back as its typed error, with what the server
// said, and unwraps to the *APIError.
func TestTypedErrors(t *testing.T) {
	t.Parallel()
	c := canned(t, map[string]func(http.ResponseWriter){
		"/v1/tenants/full/jobs": jsonAnswer(429, `{"error":"queue_full","message":"m","retry_after_ms":1500,"queue_depth":10,"capacity":10}`,
			"Retry-After", "2", "RateLimit-Policy", `"leaky";q=11;w=11`, "RateLimit", `"leaky";r=0;t=2`),
		"/v1/tenants/token/jobs":   jsonAnswer(429, `{"error":"rate_limited","message":"m","retry_after_ms":200,"queue_depth":0,"capacity":0}`, "Retry-After", "1"),
		"/v1/tenants/late/jobs":    jsonAnswer(422, `{"error":"would_expire","message":"m","expected_delay_ms":5000,"deadline":"2026-03-01T12:00:00Z"}`),
		"/v1/tenants/big/jobs":     jsonAnswer(422, `{"error":"cost_too_large","message":"m","cost":50,"max_cost":11}`),
		"/v1/tenants/down/jobs":    jsonAnswer(503, `{"error":"store_unavailable","message":"m"}`, "Retry-After", "1"),
		"/v1/tenants/nobody/jobs":  jsonAnswer(404, `{"error":"unknown_tenant","message":"m"}`),
		"/v1/tenants/secret/jobs":  jsonAnswer(403, `{"error":"forbidden","message":"m"}`),
		"/v1/tenants/garbled/jobs": jsonAnswer(400, `{"error":"invalid_json","message":"m"}`),
		"/v1/tenants/vendor/jobs":  jsonAnswer(422, `{"error":"request_not_allowed","message":"m","part":"request.path"}`),
		"/v1/tenants/form/jobs":    jsonAnswer(422, `{"error":"payload_not_encodable","message":"m","part":"payload"}`),
	})
	ctx := context.Background()
	enqueue := func(tenant string) error {
		_, err := c.Enqueue(ctx, tenant, Job{Payload: []byte(`1`)})
		return err
	}
	var full *QueueFullError
	if err := enqueue("full"); !errors.As(err, &full) || full.RetryAfter != 1500*time.Millisecond || full.Depth != 10 || full.Capacity != 10 ||
		full.Tenant != "full" || full.RateLimit.Quotas[0].Remaining != 0 || !strings.Contains(err.Error(), "queue full") {
		t.Errorf("queue_full: %#v", err)
	}
	var limited *RateLimitedError
	if err := enqueue("token"); !errors.As(err, &limited) || limited.RetryAfter != 200*time.Millisecond {
		t.Errorf("rate_limited: %#v", err)
	}
	var late *WouldExpireError
	if err := enqueue("late"); !errors.As(err, &late) || late.ExpectedDelay != 5*time.Second || late.Deadline.IsZero() {
		t.Errorf("would_expire: %#v", err)
	}
	var big *CostTooLargeError
	if err := enqueue("big"); !errors.As(err, &big) || big.Cost != 50 || big.MaxCost != 11 {
		t.Errorf("cost_too_large: %#v", err)
	}
	var na *NotAllowedError
	if err := enqueue("vendor"); !errors.As(err, &na) || na.Part != "request.path" || na.Code != "request_not_allowed" || !strings.Contains(err.Error(), "request.path") {
		t.Errorf("request_not_allowed: %#v", err)
	}
	if err := enqueue("form"); !errors.As(err, &na) || na.Part != "payload" || na.Code != "payload_not_encodable" {
		t.Errorf("payload_not_encodable: %#v", err)
	}
	if _, retry := (RetryPolicy{}).Delay(na, 1); retry {
		t.Errorf("a job its downstream cannot send is retried as it is")
	}
	var down *UnavailableError
	if err := enqueue("down"); !errors.As(err, &down) || down.RetryAfter != time.Second {
		t.Errorf("unavailable: %#v", err)
	}
	var nf *NotFoundError
	if err := enqueue("nobody"); !errors.As(err, &nf) || nf.Code != "unknown_tenant" {
		t.Errorf("not found: %#v", err)
	}
	var auth *AuthError
	if err := enqueue("secret"); !errors.As(err, &auth) || !auth.Forbidden() {
		t.Errorf("forbidden: %#v", err)
	}
	for _, tenant := range []string{"full", "token", "late", "big", "down", "nobody", "secret", "garbled", "vendor", "form"} {
		var api *APIError
		if err := enqueue(tenant); !errors.As(err, &api) || api.Code == "" || api.Message != "m" {
			t.Errorf("%s: %v does not unwrap to its *APIError", tenant, err)
		}
	}
	if _, err := New("http://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	unreachable, _ := New("http://127.0.0.1:1")
	if _, err := unreachable.Enqueue(ctx, "a", Job{Payload: []byte(`1`)}); !IsUnreachable(err) {
		t.Errorf("no server: %v", err)
	}
}

// A batch's per-job refusals are typed errors too; its fields are the
// batch's.
func TestBatchResults(t *testing.T) {
	t.Parallel()
	c := canned(t, map[string]func(http.ResponseWriter){
		"/v1/tenants/acme/jobs:batch": jsonAnswer(200, `{"results":[
			{"status":202,"id":"a","tenant":"acme","state":"queued","dispatch_at":"2026-03-01T12:00:00Z","expected_delay_ms":0,"queue_depth":1,"capacity":1},
			{"status":200,"id":"b","tenant":"acme","state":"queued","dispatch_at":"2026-03-01T12:01:00Z","expected_delay_ms":60000,"queue_depth":2,"capacity":1},
			{"status":429,"error":"queue_full","message":"m","retry_after_ms":60000,"queue_depth":2,"capacity":1},
			{"status":422,"error":"cost_too_large","message":"m","cost":3,"max_cost":2},
			{"status":422,"error":"request_not_allowed","message":"m","part":"request.headers.Authorization"}]}`,
			"RateLimit-Policy", `"leaky";q=2;w=120`, "RateLimit", `"leaky";r=0;t=60`),
	})
	b, err := c.EnqueueBatch(context.Background(), "acme", make([]Job, 5))
	if err != nil {
		t.Fatal(err)
	}
	var full *QueueFullError
	var big *CostTooLargeError
	var na *NotAllowedError
	r := b.Results
	if r[0].Admission.ID != "a" || r[1].Admission.ExpectedDelay() != time.Minute || !r[1].Admission.Repeated ||
		!errors.As(r[2].Err, &full) || full.RetryAfter != time.Minute || full.Tenant != "acme" || !errors.As(r[3].Err, &big) ||
		!errors.As(r[4].Err, &na) || na.Part != "request.headers.Authorization" || r[4].Status != 422 {
		t.Fatalf("results %+v", r)
	}
	if n, wait := b.RateLimit.Next(); n != 0 || wait != time.Minute {
		t.Fatalf("next %d %v", n, wait)
	}
}

// Retry waits out a refusal's Retry-After (and no less), stops at what is
// not worth retrying, at MaxWait, at MaxAttempts, and when ctx is done.
func TestRetry(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c := canned(t, map[string]func(http.ResponseWriter){
		"/v1/tenants/busy/jobs": func(w http.ResponseWriter) {
			if calls.Add(1) <= 2 {
				jsonAnswer(429, `{"error":"queue_full","message":"m","retry_after_ms":40,"queue_depth":1,"capacity":1}`, "Retry-After", "1")(w)
				return
			}
			jsonAnswer(202, `{"id":"x","tenant":"busy","state":"queued","dispatch_at":"2026-03-01T12:00:00Z","expected_delay_ms":0,"queue_depth":1,"capacity":1}`)(w)
		},
		"/v1/tenants/late/jobs": jsonAnswer(422, `{"error":"would_expire","message":"m","expected_delay_ms":5000,"deadline":"2026-03-01T12:00:00Z"}`),
		"/v1/tenants/slow/jobs": jsonAnswer(429, `{"error":"queue_full","message":"m","retry_after_ms":3600000,"queue_depth":1,"capacity":1}`),
	})
	ctx := context.Background()
	enqueue := func(tenant string, n *int) func(context.Context) (Admission, error) {
		return func(ctx context.Context) (Admission, error) {
			*n++
			return c.Enqueue(ctx, tenant, Job{Payload: []byte(`1`)})
		}
	}
	var n int
	start := time.Now()
	a, err := Retry(ctx, RetryPolicy{}, enqueue("busy", &n))
	if err != nil || a.ID != "x" || n != 3 || time.Since(start) < 80*time.Millisecond {
		t.Errorf("busy: %v %+v after %d calls in %v", err, a, n, time.Since(start))
	}
	for tenant, p := range map[string]RetryPolicy{"late": {}, "slow": {MaxWait: time.Minute}} {
		n = 0
		if _, err := Retry(ctx, p, enqueue(tenant, &n)); err == nil || n != 1 {
			t.Errorf("%s: %v after %d calls, want its error after one", tenant, err, n)
		}
	}
	calls.Store(-100)
	n = 0
	if _, err := Retry(ctx, RetryPolicy{MaxAttempts: 2}, enqueue("busy", &n)); err == nil || n != 2 {
		t.Errorf("max attempts: %v after %d calls", err, n)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	n = 0
	start = time.Now()
	if _, err := Retry(short, RetryPolicy{MaxAttempts: 100}, enqueue("busy", &n)); err == nil || time.Since(start) > time.Second {
		t.Errorf("ctx done: %v after %v", err, time.Since(start))
	}
}

func TestJobMarshal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		job  Job
		want string
	}{
		{Job{Payload: []byte(`{"a":1}`)}, `{"payload":{"a":1}}`},
		{Job{Payload: []byte(`1`), IdempotencyKey: "k", Cost: 2, ExpiresIn: 30 * time.Second}, `{"payload":1,"idempotency_key":"k","cost":2,"expires_in":"30s"}`},
		{Job{Payload: []byte(`1`), Deadline: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}, `{"payload":1,"deadline":"2026-03-01T12:00:00Z"}`},
		{Job{Payload: []byte(`1`), NotBefore: time.Date(2026, 12, 8, 9, 0, 0, 0, time.UTC)}, `{"payload":1,"not_before":"2026-12-08T09:00:00Z"}`},
		{Job{Payload: []byte(`1`), Delay: 90 * time.Minute, ExpiresIn: 2 * time.Hour}, `{"payload":1,"expires_in":"2h0m0s","delay":"1h30m0s"}`},
		{Job{Payload: []byte(`{"charge":"ch_1"}`), Request: &Request{Path: "/v1/refunds", Headers: map[string]string{"Stripe-Account": "acct_1"}}},
			`{"payload":{"charge":"ch_1"},"request":{"path":"/v1/refunds","headers":{"Stripe-Account":"acct_1"}}}`},
		{Job{Request: &Request{Method: "GET", Path: "/v1/charges/ch_1", Query: map[string][]string{"expand[]": {"customer", "invoice"}}}},
			`{"request":{"method":"GET","path":"/v1/charges/ch_1","query":{"expand[]":["customer","invoice"]}}}`},
	} {
		raw, err := c.job.MarshalJSON()
		if err != nil || string(raw) != c.want {
			t.Errorf("%s, want %s (%v)", raw, c.want, err)
		}
	}
}

// A job shows what it asked of its downstream's request and what was kept
// of the answer, text or bytes.
func TestJobRequestAndResponse(t *testing.T) {
	t.Parallel()
	c := canned(t, map[string]func(http.ResponseWriter){
		"/v1/jobs/declined": jsonAnswer(200, `{"id":"declined","tenant":"shop","state":"failed","attempts":1,
			"enqueued_at":"2026-03-01T12:00:00Z","dispatch_at":"2026-03-01T12:00:00Z","sent_at":"2026-03-01T12:00:00Z",
			"finished_at":"2026-03-01T12:00:01Z","last_error":"402 Payment Required","response_status":402,"cost":1,"deadline":null,
			"request":{"method":"POST","path":"/v1/refunds","query":{"expand[]":["charge"]},"headers":{"Stripe-Account":"acct_1"}},
			"response":{"status":402,"headers":{"Content-Type":"application/json"},"body":"{\"error\":{\"code\":\"card_declined\"}}","truncated":false}}`),
		"/v1/jobs/bytes": jsonAnswer(200, `{"id":"bytes","tenant":"shop","state":"succeeded","attempts":1,
			"enqueued_at":"2026-03-01T12:00:00Z","dispatch_at":"2026-03-01T12:00:00Z","sent_at":null,"finished_at":null,
			"last_error":null,"response_status":200,"cost":1,"deadline":null,
			"response":{"status":200,"headers":{},"body_base64":"/wA=","truncated":true}}`),
	})
	ctx := context.Background()
	j, err := c.Job(ctx, "declined")
	if err != nil {
		t.Fatal(err)
	}
	if r := j.Request; r == nil || r.Method != "POST" || r.Path != "/v1/refunds" || r.Query["expand[]"][0] != "charge" || r.Headers["Stripe-Account"] != "acct_1" {
		t.Errorf("request %+v", j.Request)
	}
	body, err := j.Response.Bytes()
	if j.Response.Status != 402 || j.Response.Headers["Content-Type"] != "application/json" || err != nil ||
		string(body) != `{"error":{"code":"card_declined"}}` || j.Response.Truncated {
		t.Errorf("response %+v (%q %v)", j.Response, body, err)
	}
	j, err = c.Job(ctx, "bytes")
	if err != nil {
		t.Fatal(err)
	}
	if body, err := j.Response.Bytes(); j.Request != nil || err != nil || string(body) != "\xff\x00" || !j.Response.Truncated {
		t.Errorf("bytes: request %+v, response %+v (%q %v)", j.Request, j.Response, body, err)
	}
}

// Scheduled sends, on the wire: NotBefore and Delay go as the API's
// not_before and delay; the answers' not_before, state "scheduled",
// scheduled counts and policy keys come back; schedule_full (429, no
// Retry-After) and too_far_ahead (422) are typed errors, and Retry does not
// send a job refused with schedule_full again.
func TestScheduledSends(t *testing.T) {
	t.Parallel()
	const admitted = `{"id":"s1","tenant":"acme","state":"scheduled","dispatch_at":"2026-12-08T09:00:00Z","expected_delay_ms":3600000,` +
		`"not_before":"2026-12-08T09:00:00Z","queue_depth":0,"capacity":10}`
	const full = `{"error":"schedule_full","message":"m","tenant":"acme","scheduled":3,"max_scheduled":3}`
	const ahead = `{"error":"too_far_ahead","message":"m","tenant":"acme","not_before":"2027-12-08T09:00:00Z","schedule_horizon":"720h0m0s"}`
	var fullCalls atomic.Int32
	bodies := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/v1/tenants/acme/jobs":
			bodies <- string(raw)
			jsonAnswer(202, admitted)(w)
		case "/v1/tenants/full/jobs":
			fullCalls.Add(1)
			jsonAnswer(429, full, "RateLimit-Policy", `"leaky";q=11;w=11`, "RateLimit", `"leaky";r=10;t=0`)(w)
		case "/v1/tenants/ahead/jobs":
			jsonAnswer(422, ahead)(w)
		case "/v1/tenants/acme/jobs:batch":
			jsonAnswer(200, `{"results":[{"status":202,`+admitted[1:]+`,{"status":429,`+full[1:]+`,{"status":422,`+ahead[1:]+`]}`)(w)
		case "/v1/jobs/s1":
			jsonAnswer(200, `{"id":"s1","tenant":"acme","state":"scheduled","attempts":0,"enqueued_at":"2026-12-08T08:00:00Z",
				"dispatch_at":"2026-12-08T09:00:00Z","sent_at":null,"finished_at":null,"last_error":null,"response_status":null,
				"cost":1,"deadline":null,"not_before":"2026-12-08T09:00:00Z"}`)(w)
		case "/v1/tenants/acme":
			jsonAnswer(200, `{"tenant":"acme","mode":"leaky","rate_per_second":1,"burst":1,"capacity":10,"downstream":"default",
				"queue_depth":0,"in_flight":0,"expected_delay_ms":0,"limited_by":"rate","max_in_flight":0,"scheduled":1,"max_scheduled":10000,
				"paused":false,"paused_until":null,"held":false,"accepted_total":1,"rejected_total":0,"delivered_total":0,
				"failed_total":0,"cancelled_total":0,"expired_total":0}`)(w)
		case "/v1/tenants/acme/policy":
			if r.Method == http.MethodPut {
				bodies <- string(raw)
			}
			jsonAnswer(200, `{"tenant":"acme","plan":null,"plan_from":null,"policy":{"downstream":"default","mode":"leaky","rate":"1/s",
				"capacity":10,"burst":1,"windows":[],"max_attempts":null,"max_in_flight":0,"max_scheduled":50,"schedule_horizon":"168h0m0s","callback_url":""},
				"from":{"max_scheduled":"api","schedule_horizon":"api"},"api":{"max_scheduled":50,"schedule_horizon":"168h"}}`)(w)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := time.Date(2026, 12, 8, 9, 0, 0, 0, time.UTC)
	a, err := c.Enqueue(ctx, "acme", Job{Payload: []byte(`{"to":"+1555"}`), NotBefore: at})
	if err != nil || !a.Scheduled() || !a.NotBefore.Equal(at) || !a.DispatchAt.Equal(at) || a.ExpectedDelay() != time.Hour {
		t.Fatalf("admission %+v %v", a, err)
	}
	if body := <-bodies; body != `{"payload":{"to":"+1555"},"not_before":"2026-12-08T09:00:00Z"}` {
		t.Errorf("sent %s", body)
	}
	if _, err := c.Enqueue(ctx, "acme", Job{Payload: []byte(`1`), Delay: 30 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if body := <-bodies; body != `{"payload":1,"delay":"30m0s"}` {
		t.Errorf("sent %s", body)
	}
	var sf *ScheduleFullError
	_, err = c.Enqueue(ctx, "full", Job{Payload: []byte(`1`), Delay: time.Hour})
	if !errors.As(err, &sf) || sf.Tenant != "full" || sf.Scheduled != 3 || sf.MaxScheduled != 3 || sf.Status != 429 || sf.RetryAfter != 0 ||
		!strings.Contains(err.Error(), "max_scheduled 3") {
		t.Errorf("schedule_full: %#v", err)
	}
	if _, again := (RetryPolicy{}).Delay(err, 1); again {
		t.Error("RetryPolicy.Delay sends a job refused with schedule_full again")
	}
	fullCalls.Store(0)
	if _, err := Retry(ctx, RetryPolicy{}, func(ctx context.Context) (Admission, error) {
		return c.Enqueue(ctx, "full", Job{Payload: []byte(`1`), Delay: time.Hour})
	}); !errors.As(err, &sf) || fullCalls.Load() != 1 {
		t.Errorf("Retry: %v after %d calls, want schedule_full after one", err, fullCalls.Load())
	}
	var far *TooFarAheadError
	_, err = c.Enqueue(ctx, "ahead", Job{Payload: []byte(`1`), NotBefore: at.AddDate(1, 0, 0)})
	if !errors.As(err, &far) || far.Horizon != 720*time.Hour || !far.NotBefore.Equal(at.AddDate(1, 0, 0)) || far.Status != 422 {
		t.Errorf("too_far_ahead: %#v", err)
	}
	if _, again := (RetryPolicy{}).Delay(err, 1); again {
		t.Error("RetryPolicy.Delay sends a job refused with too_far_ahead again")
	}
	b, err := c.EnqueueBatch(ctx, "acme", make([]Job, 3))
	if err != nil {
		t.Fatal(err)
	}
	if r := b.Results; !r[0].Admission.Scheduled() || !r[0].Admission.NotBefore.Equal(at) || r[1].Status != 429 || !errors.As(r[1].Err, &sf) ||
		sf.MaxScheduled != 3 || !errors.As(r[2].Err, &far) || far.Horizon != 720*time.Hour || far.Tenant != "acme" {
		t.Errorf("batch results %+v", r)
	}
	j, err := c.Job(ctx, "s1")
	if err != nil || j.State != "scheduled" || j.Finished() || j.NotBefore == nil || !j.NotBefore.Equal(at) {
		t.Errorf("job %+v %v", j, err)
	}
	tn, err := c.Tenant(ctx, "acme")
	if err != nil || tn.Scheduled != 1 || tn.MaxScheduled != 10000 {
		t.Errorf("tenant %+v %v", tn, err)
	}
	most := 50
	p, err := c.SetPolicy(ctx, "acme", PolicyKeys{MaxScheduled: &most, ScheduleHorizon: "168h"})
	if err != nil || p.InForce.MaxScheduled != 50 || p.InForce.ScheduleHorizon != "168h0m0s" || p.From["max_scheduled"] != "api" ||
		p.API == nil || *p.API.MaxScheduled != 50 || p.API.ScheduleHorizon != "168h" {
		t.Errorf("policy %+v %v", p, err)
	}
	if body := <-bodies; body != `{"windows":null,"max_scheduled":50,"schedule_horizon":"168h"}` {
		t.Errorf("sent %s", body)
	}
	one := 1
	if _, err := c.SetPolicy(ctx, "acme", PolicyKeys{MaxScheduled: &one}); err != nil {
		t.Fatal(err)
	}
	if body := <-bodies; body != `{"windows":null,"max_scheduled":1}` {
		t.Errorf("max_scheduled 1 sent as %s", body)
	}
}
