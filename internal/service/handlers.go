package service

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/dispatch"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Go handlers and partitions (DESIGN.md section 6d). On Redis each
// partition of tenants is owned by one worker at a time, whichever the
// balance gives it, and its owner sends every job of every tenant it
// holds. So the rule is the simplest that is always correct: every
// process that sends (--role all or worker) has every handler the config
// names. A worker that lacks one refuses to start (and refuses a reload
// that names one), naming the key; a stock `throttler serve` has none, so
// with such a config it runs only as --role api, beside the workers of the
// program that registers them, which send HTTP downstreams as well.

// checkHandlers refuses cfg if this process sends and cfg names a Go
// handler it does not have: a *config.Error naming the first such key.
func (r *running) checkHandlers(cfg *config.Config) error {
	if r.role == RoleAPI {
		return nil // it sends nothing
	}
	for _, h := range cfg.Handlers() {
		name, key := h[0], h[1]
		if _, ok := r.handlers[name]; ok {
			continue
		}
		why := fmt.Sprintf("names the Go handler %q, which this process does not have", name)
		if len(r.handlers) == 0 {
			why += ": a stock throttler has no Go handlers. Run it with --role api (store.backend = \"redis\"), " +
				"and send with workers of the program that registers the handler (the handler package)"
		} else {
			why += fmt.Sprintf(" (it has %s): register it under that name, or correct the name. "+
				"Every worker must have every handler the config names: any worker may own any tenant's partition", names(r.handlers))
		}
		return &config.Error{File: cfg.File, Key: key, Reason: why}
	}
	return nil
}

// call is the Go handler a downstream calls (nil: it is an HTTP one).
func (r *running) call(ds config.Downstream) dispatch.Call {
	if ds.Handler == "" {
		return nil
	}
	if c := r.handlers[ds.Handler]; c != nil {
		return c
	}
	// checkHandlers ran at start and at each reload: never here. Failing
	// beats sending a handler's jobs over HTTP to no url.
	return func(context.Context, string, queue.Job) func(time.Time) dispatch.Reply {
		return func(time.Time) dispatch.Reply {
			return dispatch.Reply{Result: queue.Retry, Error: fmt.Sprintf("this process has no Go handler %q: register it in the program", ds.Handler)}
		}
	}
}

// names lists the handlers' names, quoted and sorted.
func names(handlers map[string]dispatch.Call) string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(handlers)) {
		out = append(out, fmt.Sprintf("%q", n))
	}
	return strings.Join(out, ", ")
}
