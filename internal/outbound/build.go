package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/throttler-dev/throttler/internal/config"
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
	p, err := o.attemptPlan(j.Payload, j.Request)
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
	req.Header = o.header(j, p)
	if !p.sendBody {
		return req, nil, nil
	}
	return req, p.body, nil
}

// attemptPlan is plan for an attempt. A job without a request, the usual
// one, takes the downstream's method and url, which a reload cannot make
// it refuse: only its body is made (and checked) again, as the config
// now says.
func (o *Downstream) attemptPlan(payload json.RawMessage, r *JobRequest) (plan, error) {
	if o.url == "" || (r != nil && (r.Method != "" || r.Path != "" || len(r.Query) > 0 || len(r.Headers) > 0)) {
		return o.plan(payload, r)
	}
	p := plan{method: o.cfg.Method, url: o.url}
	p.sendBody = p.method != "GET" && p.method != "DELETE"
	var err error
	p.body, err = o.encodeBody(p.method, p.sendBody, payload)
	return p, err
}

// header is the request's header, in the order the package comment gives
// (later ones override earlier ones). Names are canonical already, so
// they are set directly, each value a one-entry slice of one backing
// array, and the map is made as large as Sign will leave it: a small Go
// map holds 8 entries, and a signed request with auth has 9, so growing
// it one Set at a time would make it twice.
func (o *Downstream) header(j BuildJob, p plan) http.Header {
	n := 5 + len(o.staticHeaders) + 1 + len(p.headers) // throttler's, static, auth, the job's
	size := n
	if len(o.macs) > 0 {
		size += 3 // Sign's webhook-*
	}
	h := make(http.Header, size)
	vals := make([]string, 0, n)
	set := func(name, v string) {
		vals = append(vals, v)
		h[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if p.sendBody {
		set("Content-Type", o.contentType())
	}
	set("User-Agent", UserAgent)
	if o.idempotency != "" {
		set(o.idempotency, j.ID)
	}
	set("X-Throttler-Tenant", j.Tenant)
	set("X-Throttler-Attempt", strconv.Itoa(j.Attempt))
	for _, kv := range o.staticHeaders {
		if !o.cfg.ProtectedHeader(kv[0]) { // refused by config; kept out whatever the config
			set(kv[0], kv[1])
		}
	}
	if o.authName != "" {
		set(o.authName, o.authValue.Reveal())
	}
	for _, kv := range p.headers { // checked by plan: allowed, not protected
		set(kv[0], kv[1])
	}
	return h
}

// noFragment is u as a request's url: without its fragment.
func noFragment(u *url.URL) string {
	c := *u
	c.Fragment, c.RawFragment = "", ""
	return c.String()
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
