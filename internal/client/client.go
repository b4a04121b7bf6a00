// Package client is a Go client of throttler's HTTP API, shared by the
// enqueue command and `throttler status`, with the rules for finding the
// server: flag, then environment, then config file, then the default.
package client

import (
	"bytes"
	"cmp"
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

	"throttler/internal/config"
)

// DefaultServer is where the API listens with no config.
const DefaultServer = "http://127.0.0.1:8080"

// Target is where the API is and how to authenticate.
type Target struct {
	Server string // base URL, e.g. http://127.0.0.1:8080
	Token  string // bearer token ("" for none)
}

// ResolveTarget picks the server and token the way `serve` picks its config:
// flags, then the environment (THROTTLER_SERVER, THROTTLER_TOKEN), then the
// config file (--config or THROTTLER_CONFIG: server.listen), then defaults.
func ResolveTarget(flagServer, flagToken, flagConfig string, env []string) (Target, error) {
	get := func(name string) string {
		for i := len(env) - 1; i >= 0; i-- {
			if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
				return v
			}
		}
		return ""
	}
	t := Target{Server: cmp.Or(flagServer, get("THROTTLER_SERVER")), Token: cmp.Or(flagToken, get("THROTTLER_TOKEN"))}
	if t.Server == "" {
		if file := cmp.Or(flagConfig, get("THROTTLER_CONFIG")); file != "" {
			cfg, err := config.Load(file, env, nil)
			if err != nil {
				return Target{}, err
			}
			t.Server = "http://" + cfg.Server.Listen
		}
	}
	t.Server = strings.TrimRight(cmp.Or(t.Server, DefaultServer), "/")
	u, err := url.Parse(t.Server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Target{}, fmt.Errorf("server %q: want a URL such as http://127.0.0.1:8080", t.Server)
	}
	return t, nil
}

// Client calls the API.
type Client struct {
	Target
	HTTP *http.Client
}

// New returns a client for t.
func New(t Target) *Client {
	return &Client{Target: t, HTTP: &http.Client{Timeout: 60 * time.Second}}
}

// APIError is an error answer of the API.
type APIError struct {
	Status  int
	Code    string `json:"error"`
	Message string `json:"message"`
	// RetryAfter is from Retry-After (or retry_after_ms when given).
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
}

// UnreachableError is a request that got no HTTP answer.
type UnreachableError struct{ Err error }

func (e *UnreachableError) Error() string { return "server unreachable: " + e.Err.Error() }
func (e *UnreachableError) Unwrap() error { return e.Err }

// do sends a request and decodes a 2xx JSON answer into out.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &UnreachableError{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return &UnreachableError{Err: err}
	}
	if resp.StatusCode >= 300 {
		e := &APIError{Status: resp.StatusCode}
		_ = json.Unmarshal(raw, e)
		var ms struct {
			RetryAfterMS *int64 `json:"retry_after_ms"`
		}
		if json.Unmarshal(raw, &ms) == nil && ms.RetryAfterMS != nil {
			e.RetryAfter = time.Duration(*ms.RetryAfterMS) * time.Millisecond
		} else if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("answer of %s %s is not what this client understands: %v", method, path, err)
		}
	}
	return nil
}

// Job is one job to enqueue.
type Job struct {
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Cost           int             `json:"cost,omitempty"`
	// Deadline (RFC 3339): the server refuses the job (422) if it cannot
	// send it by then, and never sends it after.
	Deadline string `json:"deadline,omitempty"`
}

// Result is the answer for one job of a batch.
type Result struct {
	Status          int       `json:"status"`
	ID              string    `json:"id"`
	State           string    `json:"state"`
	DispatchAt      time.Time `json:"dispatch_at"`
	ExpectedDelayMS int64     `json:"expected_delay_ms"`
	QueueDepth      int       `json:"queue_depth"`
	Capacity        int       `json:"capacity"`
	Error           string    `json:"error"`
	Message         string    `json:"message"`
	RetryAfterMS    int64     `json:"retry_after_ms"`
}

// EnqueueBatch sends up to 1000 jobs for tenant in one request.
func (c *Client) EnqueueBatch(ctx context.Context, tenant string, jobs []Job) ([]Result, error) {
	var out struct {
		Results []Result `json:"results"`
	}
	if err := c.do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/jobs:batch", map[string]any{"jobs": jobs}, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(jobs) {
		return nil, fmt.Errorf("server answered %d results for %d jobs", len(out.Results), len(jobs))
	}
	return out.Results, nil
}

// JobStatus is a job as GET /v1/jobs/{id} shows it.
type JobStatus struct {
	ID             string `json:"id"`
	Tenant         string `json:"tenant"`
	State          string `json:"state"`
	Attempts       int    `json:"attempts"`
	LastError      string `json:"last_error"`
	ResponseStatus int    `json:"response_status"`
}

// Finished reports whether the job is done for good.
func (j JobStatus) Finished() bool {
	switch j.State {
	case "succeeded", "failed", "cancelled", "expired":
		return true
	}
	return false
}

// Job fetches one job.
func (c *Client) Job(ctx context.Context, id string) (JobStatus, error) {
	var j JobStatus
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &j)
	return j, err
}

// Tenant is a tenant as the API shows it.
type Tenant struct {
	Tenant          string     `json:"tenant"`
	Mode            string     `json:"mode"`
	RatePerSecond   float64    `json:"rate_per_second"`
	Burst           int        `json:"burst"`
	Capacity        int        `json:"capacity"`
	Downstream      string     `json:"downstream"`
	QueueDepth      int        `json:"queue_depth"`
	InFlight        int        `json:"in_flight"`
	ExpectedDelayMS int64      `json:"expected_delay_ms"`
	Paused          bool       `json:"paused"`
	PausedUntil     *time.Time `json:"paused_until"`
	Held            bool       `json:"held"`
	AcceptedTotal   int64      `json:"accepted_total"`
	RejectedTotal   int64      `json:"rejected_total"`
	DeliveredTotal  int64      `json:"delivered_total"`
	FailedTotal     int64      `json:"failed_total"`
}

// Pause holds a tenant (an operator's pause: admin tokens only); Resume
// ends the hold. Both return the tenant's state.
func (c *Client) Pause(ctx context.Context, name string) (Tenant, error) {
	return c.hold(ctx, name, "pause")
}

// Resume ends an operator hold.
func (c *Client) Resume(ctx context.Context, name string) (Tenant, error) {
	return c.hold(ctx, name, "resume")
}

func (c *Client) hold(ctx context.Context, name, verb string) (Tenant, error) {
	var t Tenant
	err := c.do(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(name)+"/"+verb, nil, &t)
	return t, err
}

// Tenant fetches one tenant.
func (c *Client) Tenant(ctx context.Context, name string) (Tenant, error) {
	var t Tenant
	err := c.do(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(name), nil, &t)
	return t, err
}

// Tenants fetches every active tenant, deepest first (all pages).
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	var all []Tenant
	offset := 0
	for {
		var page struct {
			Tenants    []Tenant `json:"tenants"`
			NextOffset *int     `json:"next_offset"`
		}
		if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/tenants?offset=%d&limit=1000", offset), nil, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Tenants...)
		if page.NextOffset == nil || len(all) >= 100000 {
			return all, nil
		}
		offset = *page.NextOffset
	}
}

// IsUnreachable reports whether err means no HTTP answer came back.
func IsUnreachable(err error) bool {
	var u *UnreachableError
	return errors.As(err, &u)
}
