package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/internal/servicetest"
)

// server is the API the examples call: a whole throttler, started by
// TestMain with the tenants below, delivering to a downstream that takes
// everything.
var server string

// The first lines are the downstream's (tenants' downstream, "test"): a job
// may ask for a path under /v1/ and set Stripe-Account.
const exampleTenants = `job_paths = ["/v1/*"]
job_headers = ["Stripe-Account"]
[tenants.example-enqueue]
rate = "1/m"
capacity = 1
[tenants.example-full]
rate = "1/m"
capacity = 1
[tenants.example-retry]
mode = "token"
rate = "1/s"
burst = 1
[tenants.example-pace]
rate = "1/m"
capacity = 2
[tenants.example-request]
rate = "10/s"
[tenants.example-wait]
rate = "1/m"
capacity = 1
`

func TestMain(m *testing.M) {
	os.Exit(func() int {
		downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/refunds" && r.Header.Get("Stripe-Account") == "acct_1" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"id":"re_1","status":"succeeded"}`)
			}
		}))
		defer downstream.Close()
		dir, err := os.MkdirTemp("", "throttler-client-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		url, stop, err := servicetest.Serve(dir, exampleTenants, downstream.URL)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer stop()
		server = url
		return m.Run()
	}())
}

// Enqueue a job: it is queued, and sent at once (the tenant was quiet); the
// RateLimit fields of the answer say what room is left.
func Example() {
	ctx := context.Background()
	c, err := client.New(server) // client.WithToken(...) when the server has tokens
	if err != nil {
		fmt.Println(err)
		return
	}
	a, err := c.Enqueue(ctx, "example-enqueue", client.Job{Payload: json.RawMessage(`{"to":"+15551234567","text":"your code is 1234"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("state:", a.State)
	fmt.Println("sent within a second:", a.ExpectedDelay() < time.Second)
	bucket := a.RateLimit.Quotas[0]
	fmt.Printf("%s: %d of %d places left\n", bucket.Name, bucket.Remaining, bucket.Limit)
	// Output:
	// state: queued
	// sent within a second: true
	// leaky: 1 of 2 places left
}

// A tenant at 1 a minute with room for one waiting job: the first goes at
// once, the second waits its turn, the third is refused with what the
// server said.
func ExampleQueueFullError() {
	ctx := context.Background()
	c, _ := client.New(server)
	for i := 1; i <= 3; i++ {
		a, err := c.Enqueue(ctx, "example-full", client.Job{Payload: json.RawMessage(`"hello"`)})
		var full *client.QueueFullError
		switch {
		case errors.As(err, &full):
			fmt.Printf("job %d: refused, capacity %d: send it again in about %v\n", i, full.Capacity, full.RetryAfter.Round(time.Minute))
		case err != nil:
			fmt.Println(err)
		default:
			fmt.Printf("job %d: accepted, waits about %v\n", i, a.ExpectedDelay().Round(time.Minute))
		}
	}
	// Output:
	// job 1: accepted, waits about 0s
	// job 2: accepted, waits about 1m0s
	// job 3: refused, capacity 1: send it again in about 1m0s
}

// Retry sends a job again after the Retry-After of a refusal (plus a little
// jitter): the second job finds the token bucket (1 a second) empty, and
// gets in on its second attempt.
func ExampleRetry() {
	ctx := context.Background()
	c, _ := client.New(server)
	for i := 1; i <= 2; i++ {
		attempts := 0
		_, err := client.Retry(ctx, client.RetryPolicy{MaxAttempts: 3}, func(ctx context.Context) (client.Admission, error) {
			attempts++
			return c.Enqueue(ctx, "example-retry", client.Job{Payload: json.RawMessage(`1`)})
		})
		fmt.Printf("job %d: error %v, %d attempt(s)\n", i, err, attempts)
	}
	// Output:
	// job 1: error <nil>, 1 attempt(s)
	// job 2: error <nil>, 2 attempt(s)
}

// A producer that paces itself: after a batch that takes every place of a
// queue of 3 (2 waiting, 1 going at once) draining 1 a minute, the fields
// say to send nothing for a minute, when a place frees.
func ExampleRateLimit_Next() {
	ctx := context.Background()
	c, _ := client.New(server)
	jobs := []client.Job{{Payload: json.RawMessage(`1`)}, {Payload: json.RawMessage(`2`)}, {Payload: json.RawMessage(`3`)}}
	b, err := c.EnqueueBatch(ctx, "example-pace", jobs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, r := range b.Results {
		fmt.Printf("job %d: %d\n", i+1, r.Status)
	}
	n, wait := b.RateLimit.Next()
	fmt.Printf("send %d now, the next in %v\n", n, wait.Round(time.Second))
	// Output:
	// job 1: 202
	// job 2: 202
	// job 3: 202
	// send 0 now, the next in 1m0s
}

// A job asks its downstream for a path and a header, as far as the
// downstream allows (its job_paths and job_headers); what the vendor
// answered is kept on the job. A request the downstream does not allow is
// refused before anything is queued.
func ExampleRequest() {
	ctx := context.Background()
	c, _ := client.New(server)
	a, err := c.Enqueue(ctx, "example-request", client.Job{
		Payload: json.RawMessage(`{"payment_intent":"pi_1","amount":1000}`),
		Request: &client.Request{Path: "/v1/refunds", Headers: map[string]string{"Stripe-Account": "acct_1"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	j, err := c.Job(ctx, a.ID)
	for deadline := time.Now().Add(10 * time.Second); err == nil && !j.Finished() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // or come back later: the job keeps its answer
		j, err = c.Job(ctx, a.ID)
	}
	if err != nil || j.Response == nil {
		fmt.Println(err, j.State)
		return
	}
	body, _ := j.Response.Bytes()
	fmt.Println(j.State, j.Request.Path, j.Response.Status, string(body))

	_, err = c.Enqueue(ctx, "example-request", client.Job{Payload: json.RawMessage(`{}`), Request: &client.Request{Path: "/admin"}})
	var na *client.NotAllowedError
	if errors.As(err, &na) {
		fmt.Println("refused:", na.Code, na.Part)
	}
	// Output:
	// succeeded /v1/refunds 201 {"id":"re_1","status":"succeeded"}
	// refused: request_not_allowed request.path
}

// Wait for a job to end: one request, answered as soon as the job is
// delivered (GET /v1/jobs/{id}?wait), or when the wait is over with the
// job as it is then.
func ExampleClient_WaitJob() {
	ctx := context.Background()
	c, err := client.New(server)
	if err != nil {
		fmt.Println(err)
		return
	}
	first, err := c.Enqueue(ctx, "example-wait", client.Job{Payload: json.RawMessage(`{"n":1}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	j, err := c.WaitJob(ctx, first.ID, 10*time.Second) // sent at once: ends within the wait
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first:", j.State, j.Finished())
	second, err := c.Enqueue(ctx, "example-wait", client.Job{Payload: json.RawMessage(`{"n":2}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	j, err = c.WaitJob(ctx, second.ID, 200*time.Millisecond) // its turn is a minute away
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("second:", j.State, j.Finished())
	// Output:
	// first: succeeded true
	// second: queued false
}
