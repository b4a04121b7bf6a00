package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
)

// Job is one job to enqueue.
type Job struct {
	// Payload is the body of the request to the tenant's downstream, as
	// the downstream's body key says: any JSON value for "json", an object
	// for "form" (written as application/x-www-form-urlencoded), a string
	// for "raw". Nil only for a GET or DELETE, which sends no body.
	Payload json.RawMessage `json:"payload,omitempty"`
	// IdempotencyKey (optional, 1 to 256 printable ASCII characters): a
	// repeat gets the first answer (Admission.Repeated) and queues nothing.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Cost is how many slots of the schedule the job takes (0: one).
	Cost int `json:"cost,omitempty"`
	// Deadline: the server refuses the job (*WouldExpireError) if it cannot
	// send it by then, and never sends it after (zero: none).
	Deadline time.Time `json:"deadline,omitzero"`
	// ExpiresIn is a deadline from the server's now instead (0: none; not
	// with Deadline).
	ExpiresIn time.Duration `json:"-"`
	// NotBefore schedules the job: it is not sent before then (zero: as
	// soon as its turn comes). It is booked at the first slot at or after
	// NotBefore that the tenant's limits allow, and the Admission says
	// that slot (State "scheduled" when it was booked for later). A time
	// at or before now is an ordinary job. Refused when the tenant has its
	// max_scheduled jobs booked (*ScheduleFullError), when it is further
	// ahead than the tenant's schedule_horizon (*TooFarAheadError), or when
	// the job's deadline comes before its slot (*WouldExpireError).
	NotBefore time.Time `json:"not_before,omitzero"`
	// Delay is NotBefore from the server's now instead, sent as the API's
	// duration text ("30m0s") (0: none; not with NotBefore: the server
	// refuses both, 400 invalid_not_before).
	Delay time.Duration `json:"-"`
	// Request (optional) is what the job asks of its downstream's request:
	// a method, a path, query parameters, headers, each only as far as the
	// downstream allows; anything else is refused (*NotAllowedError).
	Request *Request `json:"request,omitempty"`
	// Type (optional) is the job's kind for a downstream that is a Go
	// handler (an asynq task's type, such as "email:welcome"); at most 256
	// printable ASCII characters.
	Type string `json:"type,omitempty"`
}

// Request is what a job asks of its downstream's request (nil: the
// downstream's own method and url). The server refuses (*NotAllowedError)
// what the downstream's job_paths, job_methods and job_headers do not
// allow, and the headers throttler owns (Authorization, Content-Type, the
// idempotency header, X-Throttler-*, webhook-*...).
type Request struct {
	// Method is GET, POST, PUT, PATCH or DELETE ("": the downstream's).
	Method string `json:"method,omitempty"`
	// Path is an absolute path under the downstream url's scheme://host,
	// such as "/v1/refunds" ("": the url's own).
	Path string `json:"path,omitempty"`
	// Query is sent after the url's own query, each name's values in order.
	Query map[string][]string `json:"query,omitempty"`
	// Headers are sent as they are (one line each, 8 KiB in all).
	Headers map[string]string `json:"headers,omitempty"`
}

// Response is what was kept of the downstream's answer to a job's latest
// attempt: its status, the headers the downstream keeps (Content-Type,
// Location, Retry-After and its keep_response_headers), and the start of
// its body (keep_response_bytes).
type Response struct {
	Status int `json:"status"`
	// Headers by canonical name, several values of one name joined with
	// ", ".
	Headers map[string]string `json:"headers"`
	// Body is the body kept when it is UTF-8 text; BodyBase64 (standard
	// encoding) when it is not. Bytes gives either.
	Body       string `json:"body,omitempty"`
	BodyBase64 string `json:"body_base64,omitempty"`
	// Truncated: the body was longer than what was kept.
	Truncated bool `json:"truncated"`
}

// Bytes is the body kept, decoded from base64 if it came so.
func (r Response) Bytes() ([]byte, error) {
	if r.BodyBase64 != "" {
		return base64.StdEncoding.DecodeString(r.BodyBase64)
	}
	return []byte(r.Body), nil
}

// MarshalJSON writes ExpiresIn and Delay as the API's duration text
// ("30s").
func (j Job) MarshalJSON() ([]byte, error) {
	type plain Job
	v := struct {
		plain
		ExpiresIn string `json:"expires_in,omitempty"`
		Delay     string `json:"delay,omitempty"`
	}{plain: plain(j)}
	if j.ExpiresIn != 0 {
		v.ExpiresIn = j.ExpiresIn.String()
	}
	if j.Delay != 0 {
		v.Delay = j.Delay.String()
	}
	return json.Marshal(v)
}

// Admission is the answer to a job taken: 202, or the first answer again
// (200, Repeated) for a repeated idempotency key.
type Admission struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// State is "queued", or "scheduled" for a job booked for later (its
	// NotBefore was later than its turn in the queue): Scheduled says so.
	State string `json:"state"`
	// DispatchAt is when its first attempt is due: for a job with a
	// NotBefore, the slot it was booked at (at or after NotBefore).
	DispatchAt      time.Time `json:"dispatch_at"`
	ExpectedDelayMS int64     `json:"expected_delay_ms"`
	// NotBefore is the job's not_before (zero: it has none).
	NotBefore time.Time `json:"not_before,omitzero"`
	// LimitedBy is "in_flight" when a cap on attempts in flight makes
	// the wait longer than the rate's (ExpectedDelayMS is then an
	// estimate from the downstream's recent latency), "" otherwise.
	LimitedBy string `json:"limited_by"`
	// QueueDepth is the tenant's jobs admitted and not yet handed to the
	// downstream, this one included; Capacity is the most that wait.
	QueueDepth int `json:"queue_depth"`
	Capacity   int `json:"capacity"`
	// Repeated: the job was there already (200): nothing was queued.
	Repeated bool `json:"-"`
	// RateLimit is what the tenant has left after this job (zero for one
	// answer of a batch: the Batch has it).
	RateLimit RateLimit `json:"-"`
}

// ExpectedDelay is how long the job waits before its first attempt.
func (a Admission) ExpectedDelay() time.Duration { return millis(a.ExpectedDelayMS) }

// Scheduled reports whether the job was booked for later, at its
// NotBefore or after (state "scheduled"): it waits outside the tenant's
// queue, and counts in Tenant.Scheduled, not in QueueDepth.
func (a Admission) Scheduled() bool { return a.State == "scheduled" }

// Batch is the answer to EnqueueBatch.
type Batch struct {
	// Results are the jobs' answers, in the order sent.
	Results []Result
	// RateLimit is what the tenant has left after the last job.
	RateLimit RateLimit
}

// Result is one job's answer in a batch: Status 202 or 200 with its
// Admission, or 429 or 422 with Err (a *QueueFullError, *RateLimitedError,
// *ScheduleFullError, *WouldExpireError, *CostTooLargeError,
// *TooFarAheadError or *NotAllowedError), as Enqueue would have answered.
type Result struct {
	Status    int
	Admission Admission
	Err       error
}

// resultOf decodes one result of a batch.
func resultOf(tenant string, raw json.RawMessage) (Result, error) {
	var head struct {
		Status int `json:"status"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return Result{}, err
	}
	r := Result{Status: head.Status}
	switch head.Status {
	case 200, 202:
		if err := json.Unmarshal(raw, &r.Admission); err != nil {
			return Result{}, err
		}
		r.Admission.Repeated = head.Status == 200
	case 422, 429:
		r.Err = typedError(&APIError{Status: head.Status, Tenant: tenant}, raw, 0)
	default:
		return Result{}, fmt.Errorf("status %d is not a job's answer", head.Status)
	}
	return r, nil
}

// JobStatus is a job as GET /v1/jobs/{id} shows it (its payload is not
// echoed).
type JobStatus struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// State is scheduled (booked for its NotBefore, not yet due), queued,
	// dispatching, retrying, succeeded, failed, cancelled or expired.
	State          string     `json:"state"`
	Attempts       int        `json:"attempts"`
	EnqueuedAt     time.Time  `json:"enqueued_at"`
	DispatchAt     time.Time  `json:"dispatch_at"`
	SentAt         *time.Time `json:"sent_at"`
	FinishedAt     *time.Time `json:"finished_at"`
	LastError      string     `json:"last_error"`
	ResponseStatus int        `json:"response_status"`
	Cost           int        `json:"cost"`
	Deadline       *time.Time `json:"deadline"`
	// NotBefore is the job's not_before (nil: none).
	NotBefore *time.Time `json:"not_before"`
	// Request is what the job asked of its downstream's request (nil: the
	// downstream's own).
	Request *Request `json:"request"`
	// Response is what was kept of the downstream's answer to the latest
	// attempt (nil: none yet).
	Response *Response `json:"response"`
}

// Finished reports whether the job is done for good.
func (j JobStatus) Finished() bool {
	switch j.State {
	case "succeeded", "failed", "cancelled", "expired":
		return true
	}
	return false
}

// Tenant is a tenant as GET /v1/tenants/{tenant} shows it: the JSON of the
// API, field for field (durations in whole milliseconds).
type Tenant struct {
	Tenant          string  `json:"tenant"`
	Mode            string  `json:"mode"`
	RatePerSecond   float64 `json:"rate_per_second"`
	Burst           int     `json:"burst"`
	Capacity        int     `json:"capacity"`
	Downstream      string  `json:"downstream"`
	QueueDepth      int     `json:"queue_depth"`
	InFlight        int     `json:"in_flight"`
	ExpectedDelayMS int64   `json:"expected_delay_ms"`
	// Scheduled is how many of its jobs are booked for later (state
	// "scheduled"), counted in neither QueueDepth nor Capacity;
	// MaxScheduled is the most it may have.
	Scheduled    int `json:"scheduled"`
	MaxScheduled int `json:"max_scheduled"`
	// LimitedBy is which limit binds ExpectedDelayMS: "rate", "window",
	// "ceiling", "in_flight" (an estimate) or "paused".
	LimitedBy string `json:"limited_by"`
	// MaxInFlight caps the tenant's attempts in flight (0: no cap of its
	// own).
	MaxInFlight int `json:"max_in_flight"`
	// Paused: nothing of the tenant is sent now; PausedUntil is when that
	// ends (nil for an operator's hold, Held, which has no end).
	Paused         bool       `json:"paused"`
	PausedUntil    *time.Time `json:"paused_until"`
	Held           bool       `json:"held"`
	AcceptedTotal  int64      `json:"accepted_total"`
	RejectedTotal  int64      `json:"rejected_total"`
	DeliveredTotal int64      `json:"delivered_total"`
	FailedTotal    int64      `json:"failed_total"`
	CancelledTotal int64      `json:"cancelled_total"`
	ExpiredTotal   int64      `json:"expired_total"`
}

// ExpectedDelay is how long a job admitted now would wait.
func (t Tenant) ExpectedDelay() time.Duration { return millis(t.ExpectedDelayMS) }

// millis is a duration the API gives in milliseconds.
func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// PolicyKeys are a tenant's policy keys as the API sets them (PUT
// /v1/tenants/{t}/policy): a key left nil (or empty) is not said, and is
// the file's. Plan names a [plans.NAME]; it says all of that plan's keys,
// and the keys given here say themselves over it.
type PolicyKeys struct {
	Plan       string `json:"plan,omitempty"`
	Downstream string `json:"downstream,omitempty"`
	Mode       string `json:"mode,omitempty"`
	Rate       string `json:"rate,omitempty"` // such as "20/s"
	Capacity   *int   `json:"capacity,omitempty"`
	Burst      *int   `json:"burst,omitempty"`
	// Windows: nil is not said; an empty, non-nil slice is "no windows".
	Windows     []string `json:"windows"`
	MaxAttempts *int     `json:"max_attempts,omitempty"`
	MaxInFlight *int     `json:"max_in_flight,omitempty"`
	// MaxScheduled bounds the jobs booked for later (1 to 1,000,000).
	MaxScheduled *int `json:"max_scheduled,omitempty"`
	// ScheduleHorizon is how far ahead a job's not_before may be, as a
	// duration such as "720h" (at most "87600h").
	ScheduleHorizon string `json:"schedule_horizon,omitempty"`
	CallbackURL     string `json:"callback_url,omitempty"`
}

// Policy is a tenant's policy as GET /v1/tenants/{t}/policy shows it: in
// force, where each key comes from ("api", "plan", "file", "default"),
// and the API's layer (nil: none, the policy is the file's).
type Policy struct {
	Tenant string `json:"tenant"`
	// Plan is the plan of the highest layer that names one ("" none), and
	// PlanFrom that layer ("api", "file", "default").
	Plan     string            `json:"plan"`
	PlanFrom string            `json:"plan_from"`
	InForce  PolicyInForce     `json:"policy"`
	From     map[string]string `json:"from"`
	API      *PolicyKeys       `json:"api"`
}

// PolicyInForce is a tenant's policy in force, every key given.
type PolicyInForce struct {
	Downstream string   `json:"downstream"`
	Mode       string   `json:"mode"`
	Rate       string   `json:"rate"`
	Capacity   int      `json:"capacity"`
	Burst      int      `json:"burst"`
	Windows    []string `json:"windows"`
	// MaxAttempts is nil when the downstream's max_attempts holds.
	MaxAttempts  *int `json:"max_attempts"`
	MaxInFlight  int  `json:"max_in_flight"`
	MaxScheduled int  `json:"max_scheduled"`
	// ScheduleHorizon is a duration text, such as "720h0m0s".
	ScheduleHorizon string `json:"schedule_horizon"`
	CallbackURL     string `json:"callback_url"`
}
