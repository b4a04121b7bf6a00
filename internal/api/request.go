package api

import (
	"fmt"
	"strings"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A job's "request" (DESIGN.md section 6a): what it asks of its
// downstream's request, checked here against the downstream's rules
// (Options.Outbound) before the job reaches the store, so that a job that
// could never be sent is refused at once (422) and nothing is queued.

// normalRequest is the job's request as it is kept: nil when it asks for
// nothing, its method in capitals.
func normalRequest(r *queue.JobRequest) *queue.JobRequest {
	if r == nil || (r.Method == "" && r.Path == "" && len(r.Query) == 0 && len(r.Headers) == 0) {
		return nil
	}
	c := *r
	c.Method = strings.ToUpper(c.Method)
	return &c
}

// bodiless reports whether a job of a tenant with settings ts and request
// r sends no body: its method (its own, else its downstream's) is GET or
// DELETE. Its payload may then be absent.
func (s *server) bodiless(ts config.TenantSettings, r *queue.JobRequest) bool {
	method := ""
	if r != nil {
		method = strings.ToUpper(r.Method)
	}
	if method == "" {
		method = s.config().Downstreams[ts.Downstream].Method
	}
	return method == "GET" || method == "DELETE"
}

// checkRequest checks the job's payload and request against its tenant's
// downstream, and its type against the downstream's Go handler: nil, or
// the *outbound.NotAllowedError that fail answers (422). Without
// Options.Outbound, or for a downstream it does not know, the request is
// not checked here (the dispatcher refuses what it cannot build).
func (s *server) checkRequest(ts config.TenantSettings, nj queue.NewJob) error {
	if err := s.checkType(ts, nj); err != nil {
		return err
	}
	if s.outbound == nil {
		return nil
	}
	o := s.outbound(ts.Downstream)
	if o == nil {
		return nil
	}
	return o.Check(nj.Payload, nj.Request)
}

// checkType refuses a job whose type the Go handler of its downstream does
// not take (Options.HandlesType): no attempt could change its type, and
// it would fail at the handler.
func (s *server) checkType(ts config.TenantSettings, nj queue.NewJob) error {
	name := s.config().Downstreams[ts.Downstream].Handler
	if s.handlesType == nil || name == "" || s.handlesType(name, ts.Downstream, nj.Type) {
		return nil
	}
	what := fmt.Sprintf("type %q", nj.Type)
	if nj.Type == "" {
		what = "no \"type\""
	}
	return &outbound.NotAllowedError{Code: "unknown_type", Part: "type",
		Reason: fmt.Sprintf("the Go handler %q of downstream %q has no handler for a job of %s: give a type it handles", name, ts.Downstream, what)}
}
