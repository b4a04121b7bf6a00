// Package handler runs throttler inside a Go program whose vendor calls
// are Go code (a vendor's SDK, or handlers already written for asynq):
// each job is handed to a Go function at its slot, instead of being sent
// to an HTTP service that would wrap that code.
//
// A downstream names a handler instead of a url:
//
//	[downstreams.sms]
//	handler = "sms"
//	timeout = "5s"
//	rate = "100/s"
//
// and the program registers it under that name and runs the service:
//
//	mux := handler.NewMux()
//	mux.HandleFunc("sms", func(ctx context.Context, job *handler.Job) ([]byte, error) {
//		return vendor.Send(ctx, job.Payload)
//	})
//	err := handler.Run(ctx, handler.Options{ConfigFile: "config.toml", Handlers: mux})
//
// Every attempt calls the handler at the job's slot, through the same gate
// as an HTTP attempt: the tenant's rate and windows, the downstream's
// ceiling, across processes on Redis, hold at the moment the handler
// starts. The handler's context ends at the downstream's timeout. Its error
// decides like an HTTP answer would (Decide, and the Kind it names):
//
//   - nil: the job succeeded (Succeeded; a 2xx);
//   - Pushback(d, err): the vendor asked to wait; the tenant pauses for d
//     as for a 429 with Retry-After, and the job keeps its place
//     (PushedBack);
//   - Permanent(err): the job fails at once, not retried (Failed; a 4xx);
//   - Cancel(err): the job is not to be done; it ends cancelled
//     (Cancelled);
//   - any other error (or a panic, or the timeout): retried with backoff,
//     counting toward max_attempts and the downstream's circuit breaker
//     (Retry; a 5xx).
//
// The bytes a handler returns are kept as the job's response (status 0,
// the body as text or base64, at most keep_response_bytes), shown by GET
// /v1/jobs/{id} as an HTTP downstream's answer is.
//
// With the embedded store the program is the whole service (the HTTP API
// included). On Redis it runs as a worker (Options.Role "worker") beside
// stock `throttler serve --role api` processes. Every process that sends
// must have every handler the config names, since any worker may own any
// tenant's partition: a worker (stock or not) that lacks one refuses to
// start, naming the key. Run the program's workers for every downstream
// (they send HTTP downstreams too) and stock processes only as the API.
//
// Handlers written for asynq run unchanged through package
// handler/asynqhandler.
package handler
