// Package client is the Go client of throttler's HTTP API: enqueue jobs
// (one or a batch), follow and cancel them, send failed ones again, read
// tenants' queues, hold and resume tenants.
//
// Every call takes a context.Context and returns the API's answer as a
// type of this package. An error answer comes back as a typed error that
// carries what the server said: *QueueFullError and *RateLimitedError (429:
// no room now, with its RetryAfter, Depth and Capacity), *ScheduleFullError
// (429: the tenant has its most jobs booked for later, with no RetryAfter),
// *WouldExpireError and *CostTooLargeError (422: no room ever),
// *TooFarAheadError (422: a NotBefore past the tenant's schedule horizon),
// *UnavailableError (503), *NotAllowedError (422: a request or payload the
// job's downstream cannot send), *NotFoundError (404), *AuthError (401,
// 403), and *APIError for the rest. Each of them unwraps to the *APIError (status, code, message) it
// came from; a request that got no answer at all is an *UnreachableError.
//
// Enqueue answers carry the RateLimit fields (draft-ietf-httpapi-
// ratelimit-headers): Admission.RateLimit and Batch.RateLimit say how much
// room the tenant has left, and RateLimit.Next how many jobs to send now or
// how long to wait, so that a producer paces itself instead of being
// refused. Retry calls a function again after the Retry-After of a refusal
// (with jitter) or after a backoff, for a producer that would rather wait
// than pace.
//
// A Client is safe for concurrent use.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls one throttler's API.
type Client struct {
	server string
	token  string
	http   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithToken authenticates every request with an API token (Authorization:
// Bearer). A server with no tokens configured needs none.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient sends requests with hc instead of a client with a 90 s
// timeout (for transports, proxies, TLS settings). A WaitJob holds one
// request for up to MaxJobWait: hc's timeout must allow that.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// New returns a client of the API at server, a base URL such as
// "http://127.0.0.1:8080".
func New(server string, opts ...Option) (*Client, error) {
	server = strings.TrimRight(server, "/")
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server %q: want a base URL such as http://127.0.0.1:8080", server)
	}
	c := &Client{server: server, http: &http.Client{Timeout: MaxJobWait + 30*time.Second}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Server is the base URL the client calls.
func (c *Client) Server() string { return c.server }

// answer is an HTTP answer read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// maxAnswer bounds what is read of an answer (a batch of 1000 results is
// well under it).
const maxAnswer = 64 << 20

// send sends a request and reads its answer, whatever its status.
func (c *Client) send(ctx context.Context, method, path string, body any) (answer, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return answer{}, ctx.Err()
		}
		return answer{}, &UnreachableError{Server: c.server, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		if ctx.Err() != nil {
			return answer{}, ctx.Err()
		}
		return answer{}, &UnreachableError{Server: c.server, Err: err}
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

// do sends a request and decodes a 2xx answer into out; any other answer
// is a typed error.
func (c *Client) do(ctx context.Context, method, path string, body, out any) (answer, error) {
	a, err := c.send(ctx, method, path, body)
	if err != nil {
		return a, err
	}
	if a.status < 200 || a.status > 299 {
		return a, errorOf(a)
	}
	if out != nil {
		if err := json.Unmarshal(a.body, out); err != nil {
			return a, fmt.Errorf("the answer to %s %s is not what this client understands (is %s a throttler?): %v", method, path, c.server, err)
		}
	}
	return a, nil
}

func tenantPath(tenant string) string { return "/v1/tenants/" + url.PathEscape(tenant) }
func jobPath(id string) string        { return "/v1/jobs/" + url.PathEscape(id) }

// Enqueue sends one job for tenant. A job over the tenant's rate waits its
// turn: the Admission says when it goes. A job with a NotBefore (or Delay)
// is booked at the first slot at or after it that the tenant's limits
// allow (Admission.Scheduled when that is later than its turn). A refusal
// is a *QueueFullError or *RateLimitedError (no room now: try again after
// RetryAfter), a *ScheduleFullError (too many jobs booked for later, and
// no time named to come back), or a *WouldExpireError, *CostTooLargeError,
// *TooFarAheadError or *NotAllowedError (never as it is).
func (c *Client) Enqueue(ctx context.Context, tenant string, job Job) (Admission, error) {
	var adm Admission
	a, err := c.do(ctx, http.MethodPost, tenantPath(tenant)+"/jobs", job, &adm)
	if err != nil {
		return Admission{}, forTenant(err, tenant)
	}
	adm.Repeated = a.status == http.StatusOK
	adm.RateLimit = rateLimitOf(a.header)
	return adm, nil
}

// EnqueueBatch sends up to 1000 jobs for tenant in one request, decided in
// order: each has its own answer in the Batch. A batch with a malformed
// job is refused whole (an *APIError, 400) and queues nothing.
func (c *Client) EnqueueBatch(ctx context.Context, tenant string, jobs []Job) (Batch, error) {
	var out struct {
		Results []json.RawMessage `json:"results"`
	}
	a, err := c.do(ctx, http.MethodPost, tenantPath(tenant)+"/jobs:batch", map[string]any{"jobs": jobs}, &out)
	if err != nil {
		return Batch{}, forTenant(err, tenant)
	}
	if len(out.Results) != len(jobs) {
		return Batch{}, fmt.Errorf("%s answered %d results for %d jobs: is it a throttler?", c.server, len(out.Results), len(jobs))
	}
	b := Batch{Results: make([]Result, len(jobs)), RateLimit: rateLimitOf(a.header)}
	for i, raw := range out.Results {
		if b.Results[i], err = resultOf(tenant, raw); err != nil {
			return Batch{}, fmt.Errorf("result %d of %s: %v", i, c.server, err)
		}
	}
	return b, nil
}

// Job fetches one job.
func (c *Client) Job(ctx context.Context, id string) (JobStatus, error) {
	var j JobStatus
	_, err := c.do(ctx, http.MethodGet, jobPath(id), nil, &j)
	return j, err
}

// MaxJobWait is the longest the server holds one request of WaitJob.
const MaxJobWait = 60 * time.Second

// WaitJob waits until job id is in a final state (succeeded, failed,
// cancelled, expired) or wait has passed, and returns the job as it is
// then: JobStatus.Finished says which. The server answers as soon as the
// job ends (GET /v1/jobs/{id}?wait), so this costs one request, not a
// poll; a wait over MaxJobWait asks again each MaxJobWait.
func (c *Client) WaitJob(ctx context.Context, id string, wait time.Duration) (JobStatus, error) {
	deadline := time.Now().Add(wait)
	for {
		ask := min(max(time.Until(deadline), 0), MaxJobWait)
		asked := time.Now()
		var j JobStatus
		_, err := c.do(ctx, http.MethodGet, jobPath(id)+"?wait="+strconv.FormatInt(ask.Milliseconds(), 10)+"ms", nil, &j)
		if err != nil || j.Finished() || !time.Now().Before(deadline) {
			return j, err
		}
		if time.Since(asked) < ask/2 {
			// Answered long before the wait with the job unfinished: a
			// server that does not wait (an older build). Poll gently.
			t := time.NewTimer(min(250*time.Millisecond, time.Until(deadline)))
			select {
			case <-ctx.Done():
				t.Stop()
				return j, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// Cancel cancels a job that has not been sent yet. One being sent or
// finished is an *APIError with status 409 (code not_cancellable).
func (c *Client) Cancel(ctx context.Context, id string) (JobStatus, error) {
	var j JobStatus
	_, err := c.do(ctx, http.MethodDelete, jobPath(id), nil, &j)
	return j, err
}

// RetryJob sends a failed job again, through its tenant's queue: it takes a
// place like a new job, so it can be refused like one.
func (c *Client) RetryJob(ctx context.Context, id string) (Admission, error) {
	var adm Admission
	a, err := c.do(ctx, http.MethodPost, jobPath(id)+"/retry", nil, &adm)
	if err != nil {
		return Admission{}, err
	}
	adm.RateLimit = rateLimitOf(a.header)
	return adm, nil
}

// FailedJobs lists a tenant's failed jobs, newest first, at most limit (1
// to 1000).
func (c *Client) FailedJobs(ctx context.Context, tenant string, limit int) ([]JobStatus, error) {
	var out struct {
		Jobs []JobStatus `json:"jobs"`
	}
	_, err := c.do(ctx, http.MethodGet, fmt.Sprintf("%s/jobs?state=failed&limit=%d", tenantPath(tenant), limit), nil, &out)
	return out.Jobs, forTenant(err, tenant)
}

// Tenant fetches one tenant's state.
func (c *Client) Tenant(ctx context.Context, name string) (Tenant, error) {
	var t Tenant
	_, err := c.do(ctx, http.MethodGet, tenantPath(name), nil, &t)
	return t, forTenant(err, name)
}

// maxTenants bounds what Tenants fetches, page after page.
const maxTenants = 100_000

// Tenants fetches every tenant with jobs waiting or in flight, deepest
// first, page after page (at most 100,000). It needs a token for all
// tenants.
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	var all []Tenant
	offset := 0
	for {
		var page struct {
			Tenants    []Tenant `json:"tenants"`
			NextOffset *int     `json:"next_offset"`
		}
		if _, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/tenants?offset=%d&limit=1000", offset), nil, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Tenants...)
		if page.NextOffset == nil || len(all) >= maxTenants {
			return all, nil
		}
		offset = *page.NextOffset
	}
}

// Pause holds a tenant (an operator's pause, admin tokens only): nothing of
// it is sent until Resume; it keeps accepting while it has room.
func (c *Client) Pause(ctx context.Context, tenant string) (Tenant, error) {
	return c.hold(ctx, tenant, "pause")
}

// Resume ends an operator's hold: the queue goes on where it stood.
func (c *Client) Resume(ctx context.Context, tenant string) (Tenant, error) {
	return c.hold(ctx, tenant, "resume")
}

func (c *Client) hold(ctx context.Context, tenant, verb string) (Tenant, error) {
	var t Tenant
	_, err := c.do(ctx, http.MethodPost, tenantPath(tenant)+"/"+verb, nil, &t)
	return t, forTenant(err, tenant)
}

// Policy is a tenant's policy, where each key comes from, and the API's
// layer.
func (c *Client) Policy(ctx context.Context, tenant string) (Policy, error) {
	var p Policy
	_, err := c.do(ctx, http.MethodGet, tenantPath(tenant)+"/policy", nil, &p)
	return p, forTenant(err, tenant)
}

// SetPolicy sets a tenant's policy over the file's (admin tokens only): in
// force at once, in every process within a second, kept across restarts.
// A policy that does not hold is a 422 invalid_policy *APIError naming the
// key, and changes nothing.
func (c *Client) SetPolicy(ctx context.Context, tenant string, keys PolicyKeys) (Policy, error) {
	var p Policy
	_, err := c.do(ctx, http.MethodPut, tenantPath(tenant)+"/policy", keys, &p)
	return p, forTenant(err, tenant)
}

// ResetPolicy drops the policy the API set for a tenant (admin tokens
// only): its policy is the file's again. A tenant with none is a 404
// no_policy *APIError.
func (c *Client) ResetPolicy(ctx context.Context, tenant string) (Policy, error) {
	var p Policy
	_, err := c.do(ctx, http.MethodDelete, tenantPath(tenant)+"/policy", nil, &p)
	return p, forTenant(err, tenant)
}

// Ready reports whether the service takes work: nil, or an
// *UnavailableError (503) saying why not.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodGet, "/readyz", nil, nil)
	return err
}

// IsUnreachable reports whether err means no HTTP answer came back.
func IsUnreachable(err error) bool {
	var u *UnreachableError
	return errors.As(err, &u)
}
