// Package api is the HTTP API: routes, validation, JSON shapes, and the one
// place where store errors become status codes.
package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"throttler/internal/clock"
	"throttler/internal/config"
	"throttler/internal/metrics"
	"throttler/internal/queue"
)

// Options configure the API.
type Options struct {
	Store queue.Store
	// Config gives the current config (it may be reloaded).
	Config func() *config.Config
	// Ready reports whether the service takes work (nil: ready). /readyz also
	// pings the store.
	Ready  func() error
	Logger *slog.Logger
	// Metrics, if set, counts admissions and serves /metrics.
	Metrics *metrics.Metrics
	// Clock turns expires_in into a deadline; the store's clock. Default
	// clock.Real.
	Clock clock.Clock
	// WorkerOnly: the process sends jobs and serves only /healthz,
	// /readyz and /metrics (throttler serve --role worker).
	WorkerOnly bool
}

type server struct {
	store   queue.Store
	config  func() *config.Config
	ready   func() error
	log     *slog.Logger
	slots   chan struct{} // requests being handled
	metrics *metrics.Metrics
	clock   clock.Clock
}

// MaxBatchJobs is the most jobs one jobs:batch request may carry.
const MaxBatchJobs = 1000

// envelopeBytes is room for the JSON around a payload (key, options).
const envelopeBytes = 64 << 10

// New returns the API's handler.
func New(opts Options) http.Handler {
	s := &server{store: opts.Store, config: opts.Config, ready: opts.Ready, log: opts.Logger,
		slots: make(chan struct{}, opts.Config().Server.MaxConcurrentRequests), metrics: opts.Metrics,
		clock: cmp.Or[clock.Clock](opts.Clock, clock.Real{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.ready == nil {
		s.ready = func() error { return nil }
	}
	mux := http.NewServeMux()
	if opts.WorkerOnly {
		mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "worker_only", "this process runs with --role worker: it sends jobs and serves /healthz, /readyz and /metrics; send API requests to a process with --role api or all", nil)
		})
	} else {
		s.routes(mux)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.metrics != nil {
		prom := promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{})
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			// Metrics show every tenant: a token scoped to some may not see them.
			if t := principal(r); t != nil && !t.AllTenants() {
				s.fail(w, r, errorf(http.StatusForbidden, "forbidden", "token %q is scoped to some tenants; /metrics needs a token for all (\"*\")", t.Name))
				return
			}
			prom.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.URL.Path+"; the API lives under /v1/ (see README)", nil)
	})
	return s.limit(s.authenticate(mux))
}

// routes adds the API's own routes (all but health and metrics).
func (s *server) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/tenants/{tenant}/jobs", s.enqueue)
	mux.HandleFunc("POST /v1/tenants/{tenant}/jobs:batch", s.enqueueBatch)
	mux.HandleFunc("GET /v1/tenants/{tenant}", s.tenant)
	mux.HandleFunc("GET /v1/tenants", s.tenants)
	mux.HandleFunc("GET /v1/jobs/{id}", s.job)
	mux.HandleFunc("DELETE /v1/jobs/{id}", s.cancel)
	mux.HandleFunc("POST /v1/jobs/{id}/retry", s.retry)
	mux.HandleFunc("GET /v1/tenants/{tenant}/jobs", s.failedJobs)
	mux.HandleFunc("POST /v1/tenants/{tenant}/pause", s.hold(true))
	mux.HandleFunc("POST /v1/tenants/{tenant}/resume", s.hold(false))
	// The same paths with other methods: a JSON 405 instead of the mux's text.
	for _, p := range []string{"/v1/tenants/{tenant}/jobs", "/v1/tenants/{tenant}/jobs:batch", "/v1/tenants/{tenant}", "/v1/tenants", "/v1/jobs/{id}", "/v1/jobs/{id}/retry", "/v1/tenants/{tenant}/pause", "/v1/tenants/{tenant}/resume", "/healthz", "/readyz"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path), nil)
		})
	}
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /static/app.js", s.pageScript)
}

// apiError is an error answer: its code, status and extra fields.
type apiError struct {
	status  int
	code    string
	message string
	fields  map[string]any
}

func (e *apiError) Error() string { return e.message }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string, fields map[string]any) {
	body := map[string]any{"error": code, "message": message}
	for k, v := range fields {
		body[k] = v
	}
	writeJSON(w, status, body)
}

// fail answers err: the one place store errors become status codes.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var rej *queue.RejectedError
	var imp *queue.ImpossibleError
	var se *queue.StateError
	switch {
	case errors.As(err, &ae):
		writeError(w, ae.status, ae.code, ae.message, ae.fields)
	case errors.As(err, &rej):
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(rej.RetryAfter), 10))
		writeError(w, http.StatusTooManyRequests, rej.Reason, rejectionMessage(rej), rejectionFields(rej))
	case errors.As(err, &imp):
		writeError(w, http.StatusUnprocessableEntity, imp.Reason, imp.Error(), impossibleFields(imp))
	case errors.As(err, &se):
		writeError(w, http.StatusConflict, "not_cancellable", se.Error()+": only queued or retrying jobs can be cancelled", map[string]any{"id": se.ID, "state": se.State})
	case errors.Is(err, queue.ErrNotFound):
		writeError(w, http.StatusNotFound, "job_not_found", "no job with this id", nil)
	case errors.Is(err, queue.ErrUnavailable):
		s.log.Error("store unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", "the job store cannot be reached; try again (with the same Idempotency-Key, a job that got in before the store went away is not taken twice)", nil)
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
	default:
		s.log.Error("unexpected error", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error", nil)
	}
}

func rejectionMessage(r *queue.RejectedError) string {
	if r.Reason == queue.ReasonRateLimited {
		return fmt.Sprintf("tenant %s has no token left; retry after %v", r.Tenant, r.RetryAfter.Round(time.Millisecond))
	}
	return fmt.Sprintf("tenant %s has %d jobs waiting, its capacity; retry after %v", r.Tenant, r.Capacity, r.RetryAfter.Round(time.Millisecond))
}

// impossibleFields say what a 422 would have needed.
func impossibleFields(e *queue.ImpossibleError) map[string]any {
	if e.Reason == queue.ReasonCostTooLarge {
		return map[string]any{"cost": e.Cost, "max_cost": e.MaxCost}
	}
	return map[string]any{"expected_delay_ms": ceilMillis(e.ExpectedDelay), "deadline": e.Deadline.UTC()}
}

func rejectionFields(r *queue.RejectedError) map[string]any {
	return map[string]any{"retry_after_ms": ceilMillis(r.RetryAfter), "queue_depth": r.QueueDepth, "capacity": r.Capacity}
}

// ceilMillis is d in whole milliseconds, rounded up (DESIGN.md: durations in
// JSON are rounded up).
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// tenantFromPath validates the {tenant} path segment, checks that the
// request's token may do a to it, and finds its settings.
func (s *server) tenantFromPath(r *http.Request, a access) (string, config.TenantSettings, error) {
	name := r.PathValue("tenant")
	if !config.ValidName(name) {
		return "", config.TenantSettings{}, errorf(http.StatusBadRequest, "invalid_tenant",
			"tenant name %q is not valid: use 1 to 128 ASCII letters, digits or . _ - + @", truncate(name, 140))
	}
	if err := authorize(r, name, a); err != nil {
		return "", config.TenantSettings{}, err
	}
	ts, ok := s.config().Tenant(name)
	if !ok {
		return "", config.TenantSettings{}, errorf(http.StatusNotFound, "unknown_tenant",
			"tenant %q is not configured and allow_unknown_tenants is false", name)
	}
	return name, ts, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// jobRequest is one job as a producer sends it.
type jobRequest struct {
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key"`
	Cost           *int            `json:"cost"`
	Deadline       string          `json:"deadline"`
	ExpiresIn      string          `json:"expires_in"`
}

// decode reads exactly one JSON value from body into v, refusing unknown
// fields and trailing data.
func decode(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return decodeError(err)
		}
		return errorf(http.StatusBadRequest, "invalid_json", "unexpected data after the JSON object: send one object per request")
	}
	return nil
}

func decodeError(err error) error {
	var mbe *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	msg := err.Error()
	switch {
	case errors.As(err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, "body_too_large", "request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, io.EOF):
		return errorf(http.StatusBadRequest, "invalid_json", "request body is empty: send a JSON object such as {\"payload\": {...}}")
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(http.StatusBadRequest, "invalid_json", "request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		return errorf(http.StatusBadRequest, "invalid_json", "field %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
	case strings.HasPrefix(msg, "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`)
		return errorf(http.StatusBadRequest, "unknown_field", "unknown field %q: a job has \"payload\" and, optionally, \"idempotency_key\", \"cost\", \"deadline\" or \"expires_in\"", field)
	}
	return errorf(http.StatusBadRequest, "invalid_json", "request body is not valid: %v", err)
}

// validate checks one job and turns it into a queue.NewJob. headerKey is the
// Idempotency-Key header ("" for batch items).
func (s *server) validate(j jobRequest, headerKey string, maxPayload int64, where string) (queue.NewJob, error) {
	if len(j.Payload) == 0 || string(j.Payload) == "null" {
		return queue.NewJob{}, errorf(http.StatusBadRequest, "missing_payload", "%s\"payload\" is required: it is the JSON body sent to the downstream", where)
	}
	if int64(len(j.Payload)) > maxPayload {
		return queue.NewJob{}, errorf(http.StatusRequestEntityTooLarge, "payload_too_large", "%spayload is %d bytes, more than max_body_bytes (%d)", where, len(j.Payload), maxPayload)
	}
	key := j.IdempotencyKey
	if headerKey != "" {
		if key != "" && key != headerKey {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_idempotency_key", "the Idempotency-Key header and \"idempotency_key\" differ: send one")
		}
		key = headerKey
	}
	if !validKey(key) {
		return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_idempotency_key", "%sidempotency key must be 1 to 256 printable ASCII characters", where)
	}
	nj := queue.NewJob{Payload: j.Payload, IdempotencyKey: key}
	if j.Cost != nil {
		if *j.Cost < 1 || *j.Cost > 1_000_000 {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_cost", "%s\"cost\" must be a whole number from 1 to 1000000, got %d", where, *j.Cost)
		}
		nj.Cost = *j.Cost
	}
	switch {
	case j.Deadline != "" && j.ExpiresIn != "":
		return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_deadline", "%ssend \"deadline\" or \"expires_in\", not both", where)
	case j.Deadline != "":
		at, err := time.Parse(time.RFC3339Nano, j.Deadline)
		if err != nil {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_deadline", "%s\"deadline\" must be an RFC 3339 time such as \"2026-03-01T12:00:00Z\": %q", where, truncate(j.Deadline, 64))
		}
		nj.Deadline = at
	case j.ExpiresIn != "":
		d, err := time.ParseDuration(j.ExpiresIn)
		if err != nil || d <= 0 || d > 366*24*time.Hour {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_deadline", "%s\"expires_in\" must be a positive duration such as \"30s\" or \"5m\": %q", where, truncate(j.ExpiresIn, 64))
		}
		nj.Deadline = s.clock.Now().Add(d)
	}
	return nj, nil
}

func validKey(k string) bool {
	if len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

func (s *server) enqueue(w http.ResponseWriter, r *http.Request) {
	tenant, _, err := s.tenantFromPath(r, write)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := s.config().Server.MaxBodyBytes
	var req jobRequest
	if err := decode(http.MaxBytesReader(w, r.Body, limit+envelopeBytes), &req); err != nil {
		s.fail(w, r, err)
		return
	}
	nj, err := s.validate(req, r.Header.Get("Idempotency-Key"), limit, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.store.Enqueue(r.Context(), tenant, []queue.NewJob{nj})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.counted(tenant, out)
	a := out[0]
	if a.Rejected != nil {
		s.fail(w, r, a.Rejected)
		return
	}
	if a.Impossible != nil {
		s.fail(w, r, a.Impossible)
		return
	}
	status := http.StatusAccepted
	if a.Duplicate {
		status = http.StatusOK
	}
	writeJSON(w, status, admissionJSON(a))
}

func (s *server) counted(tenant string, out []queue.Admission) {
	if s.metrics != nil {
		s.metrics.Admitted(tenant, out)
	}
}

func admissionJSON(a queue.Admission) map[string]any {
	j := a.Job
	dispatchAt := j.DispatchAt
	if a.Duplicate {
		dispatchAt = j.EnqueuedAt.Add(j.AdmitDelay) // the first answer, again
	}
	return map[string]any{
		"id":                j.ID,
		"tenant":            j.Tenant,
		"state":             j.State,
		"dispatch_at":       dispatchAt.UTC(),
		"expected_delay_ms": ceilMillis(a.ExpectedDelay),
		"queue_depth":       a.QueueDepth,
		"capacity":          a.Capacity,
	}
}

func (s *server) enqueueBatch(w http.ResponseWriter, r *http.Request) {
	tenant, _, err := s.tenantFromPath(r, write)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cfg := s.config()
	var req struct {
		Jobs []jobRequest `json:"jobs"`
	}
	if err := decode(http.MaxBytesReader(w, r.Body, cfg.Server.MaxBatchBytes), &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if len(req.Jobs) == 0 || len(req.Jobs) > MaxBatchJobs {
		s.fail(w, r, errorf(http.StatusBadRequest, "invalid_batch", "a batch holds 1 to %d jobs in \"jobs\", got %d", MaxBatchJobs, len(req.Jobs)))
		return
	}
	jobs := make([]queue.NewJob, len(req.Jobs))
	for i, j := range req.Jobs {
		nj, err := s.validate(j, "", cfg.Server.MaxBodyBytes, fmt.Sprintf("jobs[%d]: ", i))
		if err != nil {
			// Nothing of a batch with a bad job is queued: fix it and send
			// the whole batch again.
			s.fail(w, r, err)
			return
		}
		jobs[i] = nj
	}
	out, err := s.store.Enqueue(r.Context(), tenant, jobs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.counted(tenant, out)
	results := make([]map[string]any, len(out))
	for i, a := range out {
		switch {
		case a.Rejected != nil:
			m := rejectionFields(a.Rejected)
			m["status"] = http.StatusTooManyRequests
			m["error"] = a.Rejected.Reason
			m["message"] = rejectionMessage(a.Rejected)
			results[i] = m
		case a.Impossible != nil:
			m := impossibleFields(a.Impossible)
			m["status"] = http.StatusUnprocessableEntity
			m["error"] = a.Impossible.Reason
			m["message"] = a.Impossible.Error()
			results[i] = m
		default:
			m := admissionJSON(a)
			m["status"] = http.StatusAccepted
			if a.Duplicate {
				m["status"] = http.StatusOK
			}
			results[i] = m
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

func (s *server) tenantJSON(st queue.TenantStatus, ts config.TenantSettings) map[string]any {
	p := ts.Policy()
	var pausedUntil any // null: not paused, or an operator hold with no end
	if !st.PausedUntil.IsZero() {
		pausedUntil = st.PausedUntil.UTC().Format(time.RFC3339Nano)
	}
	return map[string]any{
		"tenant":            st.Tenant,
		"mode":              ts.Mode,
		"rate_per_second":   ts.Rate.PerSecond(),
		"burst":             p.Burst,
		"capacity":          p.Capacity,
		"downstream":        ts.Downstream,
		"queue_depth":       st.QueueDepth,
		"in_flight":         st.InFlight,
		"expected_delay_ms": ceilMillis(st.ExpectedDelay),
		"paused":            st.Paused,
		"paused_until":      pausedUntil,
		"held":              st.Held,
		"accepted_total":    st.Accepted,
		"rejected_total":    st.Rejected,
		"delivered_total":   st.Delivered,
		"failed_total":      st.Failed,
		"cancelled_total":   st.Cancelled,
		"expired_total":     st.Expired,
	}
}

func (s *server) tenant(w http.ResponseWriter, r *http.Request) {
	tenant, ts, err := s.tenantFromPath(r, read)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st, err := s.store.Tenant(r.Context(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.tenantJSON(st, ts))
}

func (s *server) tenants(w http.ResponseWriter, r *http.Request) {
	if t := principal(r); t != nil && !t.AllTenants() {
		s.fail(w, r, errorf(http.StatusForbidden, "forbidden", "token %q is scoped to some tenants: ask for each with GET /v1/tenants/{tenant}", t.Name))
		return
	}
	offset, err := intParam(r, "offset", 0, 0, math.MaxInt32)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := s.store.Tenants(r.Context(), offset, limit+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var next any
	if len(page) > limit {
		page = page[:limit]
		next = offset + limit
	}
	cfg := s.config()
	items := make([]map[string]any, len(page))
	for i, st := range page {
		ts, _ := cfg.Tenant(st.Tenant)
		items[i] = s.tenantJSON(st, ts)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": items, "next_offset": next})
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, errorf(http.StatusBadRequest, "invalid_parameter", "%s must be a whole number from %d to %d", name, lo, hi)
	}
	return n, nil
}

func jobJSON(j queue.Job) map[string]any {
	var finished, sent, lastErr, status, deadline any
	if !j.Deadline.IsZero() {
		deadline = j.Deadline.UTC()
	}
	if !j.SentAt.IsZero() {
		sent = j.SentAt.UTC()
	}
	if !j.FinishedAt.IsZero() {
		finished = j.FinishedAt.UTC()
	}
	if j.LastError != "" {
		lastErr = j.LastError
	}
	if j.ResponseStatus != 0 {
		status = j.ResponseStatus
	}
	return map[string]any{
		"id":              j.ID,
		"tenant":          j.Tenant,
		"state":           j.State,
		"attempts":        j.Attempts,
		"enqueued_at":     j.EnqueuedAt.UTC(),
		"dispatch_at":     j.DispatchAt.UTC(),
		"sent_at":         sent,
		"finished_at":     finished,
		"last_error":      lastErr,
		"response_status": status,
		"cost":            max(j.Cost, 1),
		"deadline":        deadline,
	}
}

// jobFromPath finds the {id} job and checks that the request's token may do
// a to it. A job out of the token's reach is answered as if it did not exist,
// before anything touches it.
func (s *server) jobFromPath(r *http.Request, a access) (queue.Job, error) {
	j, err := s.store.Job(r.Context(), r.PathValue("id"))
	if err == nil && !reachesJob(r, j.Tenant) {
		return queue.Job{}, queue.ErrNotFound
	}
	if err == nil {
		err = authorize(r, j.Tenant, a)
	}
	return j, err
}

func (s *server) job(w http.ResponseWriter, r *http.Request) {
	j, err := s.jobFromPath(r, read)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobJSON(j))
}

func (s *server) cancel(w http.ResponseWriter, r *http.Request) {
	j, err := s.jobFromPath(r, write)
	if err == nil {
		j, err = s.store.Cancel(r.Context(), j.ID)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobJSON(j))
}

// retry sends a failed job again, through its tenant's queue.
func (s *server) retry(w http.ResponseWriter, r *http.Request) {
	j, err := s.jobFromPath(r, write)
	var a queue.Admission
	if err == nil {
		a, err = s.store.Retry(r.Context(), j.ID)
	}
	if err == nil && a.Rejected != nil {
		err = a.Rejected
	}
	if err == nil && a.Impossible != nil {
		err = a.Impossible
	}
	var se *queue.StateError
	if errors.As(err, &se) {
		err = errorf(http.StatusConflict, "not_retryable", "%s: only failed jobs can be sent again", se.Error())
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, admissionJSON(a))
}

// hold pauses (an operator hold: nothing of the tenant is sent until
// resumed; it keeps accepting while it has room) or resumes a tenant.
func (s *server) hold(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ts, err := s.tenantFromPath(r, operate)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		var st queue.TenantStatus
		if pause {
			st, err = s.store.Pause(r.Context(), tenant)
		} else {
			st, err = s.store.Resume(r.Context(), tenant)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.log.Info("tenant hold changed", "tenant", tenant, "paused", pause, "by", who(r))
		writeJSON(w, http.StatusOK, s.tenantJSON(st, ts))
	}
}

// who names the token of a request, for the audit log.
func who(r *http.Request) string {
	if t := principal(r); t != nil {
		return t.Name
	}
	return "(no auth)"
}

// failedJobs lists a tenant's failed jobs, newest first, with their last
// error and the downstream's status.
func (s *server) failedJobs(w http.ResponseWriter, r *http.Request) {
	tenant, _, err := s.tenantFromPath(r, read)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if st := r.URL.Query().Get("state"); st != string(queue.StateFailed) {
		s.fail(w, r, errorf(http.StatusBadRequest, "invalid_parameter", "state=%q: only state=failed can be listed", st))
		return
	}
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	jobs, err := s.store.Failed(r.Context(), tenant, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	items := make([]map[string]any, len(jobs))
	for i, j := range jobs {
		items[i] = jobJSON(j)
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": items})
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.ready(); err != nil {
		writeError(w, http.StatusServiceUnavailable, "not_ready", err.Error(), nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "store_unavailable", err.Error(), nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
