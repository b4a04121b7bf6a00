// Command asynqmux runs handlers written for asynq under throttler: an
// *asynq.ServeMux with two task types and a logging middleware, unchanged,
// behind the downstream "tasks" (config.toml beside this file). Each
// tenant's jobs reach the handlers no faster than its rate, from a bounded
// queue per tenant, with an expected delay at enqueue: what asynq alone
// cannot give.
//
// With the embedded store it is the whole service:
//
//	go run ./examples/asynqmux -config examples/asynqmux/config.toml
//	curl -s localhost:8080/v1/tenants/acme/jobs -d '{"type": "email:welcome", "payload": {"to": "ada@example.com"}}'
//	curl -s localhost:8080/v1/tenants/acme/jobs -d '{"type": "sms:otp", "payload": {"to": "+15550100", "code": "123456"}}'
//
// On Redis (store.backend = "redis") run it with -role worker, as many as
// you like, beside stock `throttler serve --role api` processes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/handler/asynqhandler"
)

func main() {
	config := flag.String("config", "examples/asynqmux/config.toml", "the config file")
	role := flag.String("role", handler.RoleAll, "all (the whole service) or worker (on Redis, beside --role api processes)")
	flag.Parse()

	mux := asynq.NewServeMux()
	mux.Use(logging)
	mux.HandleFunc("email:welcome", sendWelcome)
	mux.HandleFunc("sms:otp", sendOTP)

	handlers := handler.NewMux()
	handlers.Handle("tasks", asynqhandler.New(mux))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reloads := make(chan struct{}, 1)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			reloads <- struct{}{}
		}
	}()
	err := handler.Run(ctx, handler.Options{ConfigFile: *config, Handlers: handlers, Role: *role, Reloads: reloads,
		Started: func(addr string) { fmt.Printf("listening on %s\n", addr) }})
	if err != nil {
		log.Fatal(err)
	}
}

// logging is asynq middleware: a line when a task starts (the instant
// throttler recorded, which the pacing is spaced from: for anyone checking
// it) and one when it ends. The job's id, tenant and attempt come from
// throttler (asynq.GetTaskID has none outside asynq's server).
func logging(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		start := time.Now()
		job, ok := handler.JobFromContext(ctx)
		if !ok {
			job = &handler.Job{Started: start} // called outside throttler
		}
		fmt.Printf("start %d type=%s job=%s tenant=%s attempt=%d\n", job.Started.UnixNano(), t.Type(), job.ID, job.Tenant, job.Attempt)
		err := next.ProcessTask(ctx, t)
		fmt.Printf("done type=%s job=%s took=%v err=%v\n", t.Type(), job.ID, time.Since(start).Round(time.Microsecond), err)
		return err
	})
}

// sendWelcome would call the mail vendor's SDK.
func sendWelcome(ctx context.Context, t *asynq.Task) error {
	var p struct {
		To string `json:"to"`
	}
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.To == "" {
		return fmt.Errorf("a welcome needs {\"to\": ADDRESS}: %w", asynq.SkipRetry)
	}
	return nil // mail.Send(ctx, p.To, "Welcome!")
}

// sendOTP would call the SMS vendor's SDK.
func sendOTP(ctx context.Context, t *asynq.Task) error {
	var p struct {
		To   string `json:"to"`
		Code string `json:"code"`
	}
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	if p.Code == "" {
		return errors.New("no code yet") // retried
	}
	return nil // sms.Send(ctx, p.To, "Your code is "+p.Code)
}
