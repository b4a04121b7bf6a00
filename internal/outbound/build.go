package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"throttler/internal/config"
)

// BuildJob is what Build needs of a job.
type BuildJob struct {
	ID      string // the idempotency header's value, the same on every attempt
	Tenant  string
	Attempt int // 1 for the first
	Payload json.RawMessage
	Request *JobRequest // nil: the downstream's own method and url
}

// Build makes the request of one attempt, with ctx, and returns its body
// too (nil for GET and DELETE), which Sign needs. It is pure: no clock,
// no I/O; the same job gives the same request. It fails only with a
// *NotAllowedError, for a job that the downstream (since a reload, say) no
// longer allows: such a job cannot be sent.
func (o *Downstream) Build(ctx context.Context, j BuildJob) (*http.Request, []byte, error) {
	p, err := o.plan(j.Payload, j.Request)
	if err != nil {
		return nil, nil, err
	}
	var body io.Reader
	if p.sendBody {
		body = bytes.NewReader(p.body)
	}
	req, err := http.NewRequestWithContext(ctx, p.method, p.url, body)
	if err != nil {
		return nil, nil, &NotAllowedError{Code: CodeRequestNotAllowed, Part: "request", Reason: err.Error()}
	}
	h := req.Header
	if p.sendBody {
		h.Set("Content-Type", o.contentType())
	}
	h.Set("User-Agent", UserAgent)
	if o.idempotency != "" {
		h.Set(o.idempotency, j.ID)
	}
	h.Set("X-Throttler-Tenant", j.Tenant)
	h.Set("X-Throttler-Attempt", strconv.Itoa(j.Attempt))
	for _, kv := range o.staticHeaders {
		if !o.cfg.ProtectedHeader(kv[0]) { // refused by config; kept out whatever the config
			h.Set(kv[0], kv[1])
		}
	}
	if o.authName != "" {
		h.Set(o.authName, o.authValue.Reveal())
	}
	for _, kv := range p.headers { // checked by plan: allowed, not protected
		h.Set(kv[0], kv[1])
	}
	if !p.sendBody {
		return req, nil, nil
	}
	return req, p.body, nil
}

func (o *Downstream) contentType() string {
	switch o.cfg.Body {
	case config.BodyForm:
		return "application/x-www-form-urlencoded"
	case config.BodyRaw:
		return o.cfg.ContentType
	}
	return "application/json"
}
