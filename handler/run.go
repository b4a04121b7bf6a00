package handler

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/dispatch"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/service"
)

// Roles a program's process can run (Options.Role).
const (
	// RoleAll runs the API and the dispatcher: the whole service. The
	// only role on the embedded store.
	RoleAll = service.RoleAll
	// RoleWorker runs the dispatcher only (it serves /healthz, /readyz
	// and /metrics), beside stock `throttler serve --role api` processes
	// on one Redis.
	RoleWorker = service.RoleWorker
)

// Options configure Run.
type Options struct {
	// ConfigFile is the config.toml to load ("": the built-in defaults),
	// with THROTTLER_<SECTION>_<KEY> variables from the environment over
	// it, as `throttler serve` loads it.
	ConfigFile string
	// Overrides are "section.key=value" settings over the file and the
	// environment, as serve's flags give (say "server.listen=127.0.0.1:0").
	Overrides []string
	// Handlers are the handlers by the names downstreams give. Every
	// handler the config names must be here.
	Handlers *Mux
	// Role is RoleAll (default) or RoleWorker (store.backend = "redis").
	Role string
	// Logger receives the service's log. Default: text on stderr.
	Logger *slog.Logger
	// Started, if set, is told the address the API (or, for a worker,
	// /healthz and /metrics) listens on, once it does.
	Started func(addr string)
	// Reloads, if set, brings config reloads (as serve's SIGHUP): send
	// on it to load ConfigFile again. A reload that names a handler the
	// Mux lacks is refused and the running config kept.
	Reloads <-chan struct{}
}

// Run loads the config and runs the service with the handlers until ctx
// is done, then stops cleanly: attempts already begun finish (within
// server.shutdown_timeout) and their outcome is recorded; waiting jobs
// stay in the store. A config that names a handler the Mux does not have
// is refused before anything starts, with an error naming the key.
func Run(ctx context.Context, opts Options) error {
	if opts.Handlers == nil {
		opts.Handlers = NewMux()
	}
	load := func() (*config.Config, error) { return config.Load(opts.ConfigFile, os.Environ(), opts.Overrides) }
	cfg, err := load()
	if err != nil {
		return err
	}
	log := cmp.Or(opts.Logger, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	reloads := make(chan *config.Config)
	go forwardReloads(ctx, opts.Reloads, load, reloads, log)
	return service.Run(ctx, service.Options{Config: cfg, Logger: log, Started: opts.Started, Role: opts.Role,
		Handlers: calls(opts.Handlers), Types: types(opts.Handlers), Reloads: reloads})
}

// types are the Mux's Typed handlers' Handles, by name.
func types(m *Mux) map[string]func(downstream, typ string) bool {
	out := map[string]func(downstream, typ string) bool{}
	for _, name := range m.Names() {
		if t := m.typed(name); t != nil {
			out[name] = t.Handles
		}
	}
	return out
}

// forwardReloads loads the config at each reload asked for and passes it
// on; one that does not load is logged, naming the key, and dropped.
func forwardReloads(ctx context.Context, asked <-chan struct{}, load func() (*config.Config, error), out chan<- *config.Config, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-asked:
			if !ok {
				return
			}
			cfg, err := load()
			if err != nil {
				log.Error("config reload refused; the running config is kept", "err", err)
				continue
			}
			select {
			case out <- cfg:
			case <-ctx.Done():
				return
			}
		}
	}
}

// calls are the Mux's handlers as the dispatcher calls them.
func calls(m *Mux) map[string]dispatch.Call {
	out := map[string]dispatch.Call{}
	for _, name := range m.Names() {
		h, typed := m.handler(name), m.typed(name)
		out[name] = func(ctx context.Context, downstream string, j queue.Job) func(time.Time) dispatch.Reply {
			if typed != nil && !typed.Handles(downstream, j.Type) {
				// Admitted where the handler is not known (a stock API
				// process): no attempt can change its type.
				return func(time.Time) dispatch.Reply {
					return dispatch.Reply{Result: queue.Failed, Error: unknownType(name, downstream, j.Type)}
				}
			}
			// Built before the gate: after it, only the call.
			job := jobOf(downstream, j)
			ctx = context.WithValue(ctx, jobKey{}, job)
			run := func() ([]byte, error) { return h.Handle(ctx, job) }
			if p, ok := h.(Preparer); ok {
				run = p.Prepare(ctx, job)
			}
			return func(started time.Time) dispatch.Reply {
				job.Started = started
				body, err := run()
				return reply(body, err)
			}
		}
	}
	return out
}

// jobOf is the queue's job as a handler gets it.
func jobOf(downstream string, j queue.Job) *Job {
	job := &Job{ID: j.ID, Tenant: j.Tenant, Downstream: downstream, Type: j.Type, Attempt: j.Attempts, Payload: j.Payload}
	if r := j.Request; r != nil {
		job.Request = &Request{Method: r.Method, Path: r.Path, Query: r.Query, Headers: r.Headers}
	}
	return job
}

// unknownType says that handler name of downstream takes no job of type
// typ (a job's last_error).
func unknownType(name, downstream, typ string) string {
	what := fmt.Sprintf("type %q", typ)
	if typ == "" {
		what = "no type (\"type\" left out)"
	}
	return fmt.Sprintf("the Go handler %q of downstream %q has no handler for a job of %s: give a type it handles, or register one in the program", name, downstream, what)
}
