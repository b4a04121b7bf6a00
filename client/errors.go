package client

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// APIError is an error answer of the API: {"error": Code, "message":
// Message}. Every typed error of this package unwraps to one, so
// errors.As(err, &apiErr) gives the status and code of any of them.
type APIError struct {
	Status  int    // HTTP status
	Code    string `json:"error"` // the API's error code, such as "queue_full"
	Message string `json:"message"`
	// Tenant is the tenant of the request, if it named one.
	Tenant string `json:"-"`
	// RetryAfter is how long the server said to wait (retry_after_ms, or
	// the Retry-After header), 0 if it did not say.
	RetryAfter time.Duration `json:"-"`
	// RateLimit is what the tenant has left, on refusals of an enqueue.
	RateLimit RateLimit `json:"-"`
}

func (e *APIError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
}

// QueueFullError is a job refused because a leaky tenant's queue is full
// (429 queue_full). Send it again after RetryAfter: a place frees then.
type QueueFullError struct {
	*APIError
	Depth    int // jobs admitted and not yet handed to the downstream
	Capacity int // the most that wait
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("tenant %s: queue full (%d jobs, capacity %d): send it again in %v, or pace sending by the RateLimit fields",
		e.Tenant, e.Depth, e.Capacity, e.RetryAfter)
}
func (e *QueueFullError) Unwrap() error { return e.APIError }

// RateLimitedError is a job refused because a token tenant has no token
// left, or a window of the tenant is full (429 rate_limited). Send it
// again after RetryAfter.
type RateLimitedError struct {
	*APIError
	Depth    int
	Capacity int
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("tenant %s: rate limited: send it again in %v, or pace sending by the RateLimit fields", e.Tenant, e.RetryAfter)
}
func (e *RateLimitedError) Unwrap() error { return e.APIError }

// ScheduleFullError is a job with a NotBefore (or Delay) refused because
// its tenant already has MaxScheduled jobs booked for later (429
// schedule_full). The answer names no time to come back (no Retry-After:
// room comes as booked jobs reach their slots), so Retry and
// RetryPolicy.Delay do not send it again; send it later, without a
// NotBefore, or raise the tenant's max_scheduled.
type ScheduleFullError struct {
	*APIError
	Scheduled    int // jobs of the tenant booked for later
	MaxScheduled int // the most it may have
}

func (e *ScheduleFullError) Error() string {
	return fmt.Sprintf("tenant %s: schedule full (%d jobs scheduled for later, its max_scheduled %d): send it again once some have gone, or raise max_scheduled",
		e.Tenant, e.Scheduled, e.MaxScheduled)
}
func (e *ScheduleFullError) Unwrap() error { return e.APIError }

// TooFarAheadError is a job refused because its NotBefore is further ahead
// than its tenant's schedule_horizon, Horizon (422 too_far_ahead). Sending
// it again as it is does not help until its time is within the horizon.
type TooFarAheadError struct {
	*APIError
	NotBefore time.Time     // the job's not_before
	Horizon   time.Duration // how far ahead the tenant may book
}

func (e *TooFarAheadError) Error() string {
	return fmt.Sprintf("tenant %s: not_before %s is further ahead than its schedule_horizon (%v): send it later, or raise schedule_horizon",
		e.Tenant, e.NotBefore.Format(time.RFC3339), e.Horizon)
}
func (e *TooFarAheadError) Unwrap() error { return e.APIError }

// WouldExpireError is a job refused for good: it would wait ExpectedDelay,
// past its Deadline (422 would_expire). Sending it again does not help;
// give it a later deadline, or drop it.
type WouldExpireError struct {
	*APIError
	ExpectedDelay time.Duration
	Deadline      time.Time
}

func (e *WouldExpireError) Error() string {
	return fmt.Sprintf("tenant %s: the job would wait %v and miss its deadline %s: give it a later deadline or drop it",
		e.Tenant, e.ExpectedDelay, e.Deadline.Format(time.RFC3339))
}
func (e *WouldExpireError) Unwrap() error { return e.APIError }

// CostTooLargeError is a job refused for good: its Cost is more than the
// tenant's bucket can ever hold, MaxCost (422 cost_too_large). Split it.
type CostTooLargeError struct {
	*APIError
	Cost    int
	MaxCost int
}

func (e *CostTooLargeError) Error() string {
	return fmt.Sprintf("tenant %s: a job of cost %d can never be admitted (at most %d): split it", e.Tenant, e.Cost, e.MaxCost)
}
func (e *CostTooLargeError) Unwrap() error { return e.APIError }

// NotAllowedError is a job refused for good because its downstream cannot
// make its request (422): the request asks what the downstream does not
// allow (request_not_allowed: a path outside its job_paths, a header not in
// its job_headers or one throttler owns...), or the payload does not fit
// its body (payload_not_encodable: form needs an object, raw a string, GET
// and DELETE none). Part names what was refused ("request.path",
// "request.headers.X-Foo", "payload"). Sending it again does not help: fix
// the job, or the downstream's config.
type NotAllowedError struct {
	*APIError
	Part string
}

func (e *NotAllowedError) Error() string {
	return fmt.Sprintf("tenant %s: %s: %s (fix the job's %s; sending it again as it is does not help)", e.Tenant, e.Code, e.Message, e.Part)
}
func (e *NotAllowedError) Unwrap() error { return e.APIError }

// UnavailableError is a 503: the store cannot be reached
// (store_unavailable), the server is past its limit of requests at once
// (overloaded), or it does not take work (not_ready). Try again after
// RetryAfter; an enqueue with the same idempotency key is not taken twice.
type UnavailableError struct{ *APIError }

func (e *UnavailableError) Unwrap() error { return e.APIError }

// NotFoundError is a 404: no such tenant (unknown_tenant: not configured,
// and the server takes no others), no such job (job_not_found; a job of a
// tenant the token does not reach is not found either), or a process that
// only sends jobs (worker_only).
type NotFoundError struct{ *APIError }

func (e *NotFoundError) Unwrap() error { return e.APIError }

// AuthError is a 401 (no valid token: pass one with WithToken) or a 403
// (the token's role or tenants do not allow the call).
type AuthError struct{ *APIError }

func (e *AuthError) Unwrap() error { return e.APIError }

// Forbidden reports whether the token was valid but not allowed (403).
func (e *AuthError) Forbidden() bool { return e.Status == http.StatusForbidden }

// UnreachableError is a request that got no HTTP answer.
type UnreachableError struct {
	Server string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("server %s unreachable: %v (is it running, and is the URL right?)", e.Server, e.Err)
}
func (e *UnreachableError) Unwrap() error { return e.Err }

// errorOf is the typed error of a non-2xx answer.
func errorOf(a answer) error {
	e := &APIError{Status: a.status, RateLimit: rateLimitOf(a.header)}
	_ = json.Unmarshal(a.body, e)
	if e.Code == "" {
		e.Message = strings.TrimSpace(string(a.body[:min(len(a.body), 200)]))
	}
	var secs time.Duration
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && s >= 0 {
		secs = time.Duration(s) * time.Second
	}
	return typedError(e, a.body, secs)
}

// typedError makes e (status set) the error of its kind, with the fields
// of body; retryAfter is the Retry-After header's, when the body has none.
func typedError(e *APIError, body []byte, retryAfter time.Duration) error {
	var f struct {
		Error         string    `json:"error"`
		Message       string    `json:"message"`
		RetryAfterMS  *int64    `json:"retry_after_ms"`
		QueueDepth    int       `json:"queue_depth"`
		Capacity      int       `json:"capacity"`
		ExpectedDelay int64     `json:"expected_delay_ms"`
		Deadline      time.Time `json:"deadline"`
		Cost          int       `json:"cost"`
		MaxCost       int       `json:"max_cost"`
		Part          string    `json:"part"`
		Tenant        string    `json:"tenant"`
		Scheduled     int       `json:"scheduled"`
		MaxScheduled  int       `json:"max_scheduled"`
		NotBefore     time.Time `json:"not_before"`
		Horizon       string    `json:"schedule_horizon"`
	}
	_ = json.Unmarshal(body, &f)
	e.Code, e.Message = cmp.Or(e.Code, f.Error), cmp.Or(e.Message, f.Message)
	e.Tenant = cmp.Or(e.Tenant, f.Tenant)
	e.RetryAfter = retryAfter
	if f.RetryAfterMS != nil {
		e.RetryAfter = millis(*f.RetryAfterMS) // finer than the header
	}
	switch {
	case e.Code == "queue_full":
		return &QueueFullError{APIError: e, Depth: f.QueueDepth, Capacity: f.Capacity}
	case e.Code == "rate_limited":
		return &RateLimitedError{APIError: e, Depth: f.QueueDepth, Capacity: f.Capacity}
	case e.Code == "schedule_full":
		return &ScheduleFullError{APIError: e, Scheduled: f.Scheduled, MaxScheduled: f.MaxScheduled}
	case e.Code == "too_far_ahead":
		horizon, _ := time.ParseDuration(f.Horizon)
		return &TooFarAheadError{APIError: e, NotBefore: f.NotBefore, Horizon: horizon}
	case e.Code == "would_expire":
		return &WouldExpireError{APIError: e, ExpectedDelay: millis(f.ExpectedDelay), Deadline: f.Deadline}
	case e.Code == "cost_too_large":
		return &CostTooLargeError{APIError: e, Cost: f.Cost, MaxCost: f.MaxCost}
	case e.Code == "request_not_allowed", e.Code == "payload_not_encodable":
		return &NotAllowedError{APIError: e, Part: f.Part}
	case e.Status == http.StatusServiceUnavailable:
		return &UnavailableError{e}
	case e.Status == http.StatusNotFound:
		return &NotFoundError{e}
	case e.Status == http.StatusUnauthorized, e.Status == http.StatusForbidden:
		return &AuthError{e}
	}
	return e
}

// forTenant names tenant in err's *APIError, if it has one.
func forTenant(err error, tenant string) error {
	var e *APIError
	if errors.As(err, &e) {
		e.Tenant = tenant
	}
	return err
}
