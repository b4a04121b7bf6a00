package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/handler"
)

// A program that is the whole service: the embedded store, the API, and a
// Go handler for the downstream "sms". Here it takes one job through the
// Go client and stops.
func Example() {
	dir, _ := os.MkdirTemp("", "handler-example")
	defer os.RemoveAll(dir)
	config := filepath.Join(dir, "config.toml")
	os.WriteFile(config, []byte(fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[store]
path = %q
[downstreams.sms]
handler = "sms"
timeout = "5s"
[tenant_defaults]
downstream = "sms"
rate = "10/s"
`, filepath.Join(dir, "throttler.db"))), 0o600)

	sent := make(chan string, 1)
	mux := handler.NewMux()
	mux.HandleFunc("sms", func(ctx context.Context, job *handler.Job) ([]byte, error) {
		// Your vendor's SDK goes here, with job.ID as its idempotency key.
		sent <- fmt.Sprintf("%s sends %s (attempt %d)", job.Tenant, job.Payload, job.Attempt)
		return []byte(`{"sid":"SM1"}`), nil
	})
	ctx, stop := context.WithCancel(context.Background())
	started, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- handler.Run(ctx, handler.Options{ConfigFile: config, Handlers: mux,
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Started: func(addr string) { started <- addr }})
	}()
	c, _ := client.New("http://" + <-started)
	if _, err := c.Enqueue(ctx, "acme", client.Job{Payload: json.RawMessage(`{"to":"+15550100"}`)}); err != nil {
		fmt.Println(err)
	}
	fmt.Println(<-sent)
	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// acme sends {"to":"+15550100"} (attempt 1)
	// stopped: <nil>
}

// A handler's error decides what happens to the job.
func ExampleDecide() {
	for _, err := range []error{
		nil,
		errors.New("vendor timeout"),
		handler.Pushback(30*time.Second, errors.New("429 from the vendor")),
		handler.Permanent(errors.New("invalid phone number")),
		handler.Cancel(errors.New("the user unsubscribed")),
		fmt.Errorf("wrapped: %w", handler.Permanent(errors.New("declined"))),
	} {
		kind, after := handler.Decide(err)
		fmt.Println(kind, after)
	}
	// Output:
	// succeeded 0s
	// retry 0s
	// pushed back 30s
	// failed 0s
	// cancelled 0s
	// failed 0s
}

// JSON decodes each job's payload for the handler; a payload that does not
// decode fails the job without a retry.
func ExampleJSON() {
	type sms struct {
		To   string `json:"to"`
		Text string `json:"text"`
	}
	h := handler.JSON(func(ctx context.Context, job *handler.Job, m sms) ([]byte, error) {
		fmt.Printf("to %s: %s\n", m.To, m.Text)
		return nil, nil
	})
	h.Handle(context.Background(), &handler.Job{Payload: json.RawMessage(`{"to":"+15550100","text":"hi"}`)})
	_, err := h.Handle(context.Background(), &handler.Job{Payload: json.RawMessage(`"not an object"`)})
	kind, _ := handler.Decide(err)
	fmt.Println(kind)
	// Output:
	// to +15550100: hi
	// failed
}

// Middleware wraps every handler of a Mux: here it logs each call's
// outcome.
func ExampleMux_Use() {
	mux := handler.NewMux()
	mux.Use(func(next handler.Handler) handler.Handler {
		return handler.HandlerFunc(func(ctx context.Context, job *handler.Job) ([]byte, error) {
			out, err := next.Handle(ctx, job)
			kind, _ := handler.Decide(err)
			fmt.Printf("%s %s: %v\n", job.Downstream, job.ID, kind)
			return out, err
		})
	})
	mux.HandleFunc("sms", func(ctx context.Context, job *handler.Job) ([]byte, error) { return nil, nil })
	fmt.Println(mux.Names())
	// Output:
	// [sms]
}
