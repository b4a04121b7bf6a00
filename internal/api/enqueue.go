package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

// jobRequest is one job as a producer sends it.
type jobRequest struct {
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key"`
	Cost           *int            `json:"cost"`
	Deadline       string          `json:"deadline"`
	ExpiresIn      string          `json:"expires_in"`
	// NotBefore (RFC 3339) or Delay (a duration from now): the job is not
	// sent before then (DESIGN.md section 6e).
	NotBefore string `json:"not_before"`
	Delay     string `json:"delay"`
	// Request is what the job asks of its downstream's request (DESIGN.md
	// section 6a), checked against the downstream before it is queued.
	Request *queue.JobRequest `json:"request"`
	// Type is the job's kind for a downstream that is a Go handler
	// (DESIGN.md section 6d: an asynq task's type); "" for none.
	Type string `json:"type"`
	// CallbackURL and CallbackOn: where and on which final states the
	// job's end is told (DESIGN.md section 6b); the tenant's callback_url
	// when the job names none.
	CallbackURL string   `json:"callback_url"`
	CallbackOn  []string `json:"callback_on"`
	// null is the first optional field given as null, or as "" where its
	// value cannot be empty ("": none). The document's types and patterns
	// forbid both, and encoding/json would read them as absent: validate
	// refuses them instead.
	null, empty string
}

// optionalFields are a job's fields besides payload, in the order a
// refusal names them.
var optionalFields = []string{"idempotency_key", "cost", "deadline", "expires_in", "not_before", "delay", "request", "type", "callback_url", "callback_on"}

// nonEmptyFields are the string fields whose value cannot be "" (a type
// can: none).
var nonEmptyFields = []string{"idempotency_key", "deadline", "expires_in", "not_before", "delay", "callback_url"}

// UnmarshalJSON is encoding/json's, with unknown fields refused and an
// optional field given as null noted (null).
func (j *jobRequest) UnmarshalJSON(b []byte) error { return j.decodeJSON(b, false) }

// decodeJSON is UnmarshalJSON; alone, b is a request's whole body, which
// must hold this one value and nothing after it (errTrailing). A single
// job's body is decoded this way, once, not by a decoder that would read
// the value and then hand it here to be read again.
func (j *jobRequest) decodeJSON(b []byte, alone bool) error {
	type plain jobRequest // its own methods, without this one
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(j)); err != nil {
		return err
	}
	if alone {
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return errTrailing
		}
	}
	// Most jobs hold no null and no "": only those that do are read again.
	if !bytes.Contains(b, []byte("null")) && !bytes.Contains(b, []byte(`""`)) {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	for _, name := range optionalFields {
		if v, ok := fields[name]; ok && string(v) == "null" {
			j.null = name
			return nil
		}
	}
	if j.null, j.empty = requestFault(fields["request"]); j.null != "" {
		return nil
	}
	for _, name := range nonEmptyFields {
		if v, ok := fields[name]; ok && string(v) == `""` {
			j.empty = name
			return nil
		}
	}
	return nil
}

// requestFault names the first part of a job's "request" given as null
// where null is none of its values (null: its method, path, query or
// headers, a header's value, an item of a query parameter's array; a query
// parameter itself may be null, as if absent), or given as "" where it
// cannot be empty (empty: its path, of minLength 1 in the document).
// encoding/json would read either as absent.
func requestFault(raw json.RawMessage) (null, empty string) {
	var req map[string]json.RawMessage
	if json.Unmarshal(raw, &req) != nil {
		return "", "" // absent, or not an object: decoding the job says so
	}
	for _, part := range []string{"method", "path", "query", "headers"} {
		if v, ok := req[part]; ok && isNull(v) {
			return "request." + part, ""
		}
	}
	var headers map[string]json.RawMessage
	_ = json.Unmarshal(req["headers"], &headers)
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		if isNull(headers[name]) {
			return "request.headers." + name, ""
		}
	}
	var query map[string]json.RawMessage
	_ = json.Unmarshal(req["query"], &query)
	for _, name := range slices.Sorted(maps.Keys(query)) {
		var items []json.RawMessage
		if json.Unmarshal(query[name], &items) == nil && slices.ContainsFunc(items, isNull) {
			return "request.query." + name, ""
		}
	}
	if string(bytes.TrimSpace(req["path"])) == `""` {
		return "", "request.path"
	}
	return "", ""
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// decode reads exactly one JSON value from body into v, refusing a body
// that is not UTF-8, unknown fields and trailing data.
func decode(body io.Reader, v any) error {
	raw, err := io.ReadAll(body)
	if err != nil {
		return decodeError(err)
	}
	// encoding/json takes bytes that are not UTF-8 (a RawMessage keeps
	// them as they came): a payload would go on as application/json, which
	// is UTF-8 (RFC 8259), and the vendor would refuse or mangle it.
	if at := notUTF8(raw); at >= 0 {
		return errorf(http.StatusBadRequest, "invalid_utf8", "request body is not UTF-8 (at byte %d): JSON is UTF-8 (RFC 8259); send text as UTF-8, and bytes that are not text in base64", at)
	}
	if j, ok := v.(*jobRequest); ok {
		if err := j.decodeJSON(raw, true); err != nil {
			return decodeError(err)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return decodeError(errTrailing)
	}
	return nil
}

// errTrailing is a body with more after its JSON value.
var errTrailing = errors.New("unexpected data after the JSON object")

// notUTF8 is the offset of the first byte of b that is not part of a UTF-8
// sequence, or -1 when b is UTF-8.
func notUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

func decodeError(err error) error {
	var mbe *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	msg := err.Error()
	switch {
	case errors.As(err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, "body_too_large", "request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, errSlowBody):
		return errorf(http.StatusRequestTimeout, "body_too_slow", "%v", err)
	case errors.Is(err, errTrailing):
		return errorf(http.StatusBadRequest, "invalid_json", "unexpected data after the JSON object: send one object per request")
	case errors.Is(err, io.EOF):
		return errorf(http.StatusBadRequest, "invalid_json", "request body is empty: send a JSON object such as {\"payload\": {...}}")
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(http.StatusBadRequest, "invalid_json", "request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		return errorf(http.StatusBadRequest, "invalid_json", "field %q must be %s, not %s", typ.Field, kindName(typ.Type), typ.Value)
	case strings.HasPrefix(msg, "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`)
		return errorf(http.StatusBadRequest, "unknown_field", "unknown field %q: a job has \"payload\" and, optionally, \"idempotency_key\", \"cost\", \"deadline\", \"expires_in\", \"not_before\", \"delay\", \"request\", \"type\", \"callback_url\" or \"callback_on\" (\"request\" with \"method\", \"path\", \"query\" and \"headers\")", field)
	}
	return errorf(http.StatusBadRequest, "invalid_json", "request body is not valid: %v", err)
}

// kindName says what JSON a Go type takes, for a type error's message.
func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "a whole number"
	case reflect.Bool:
		return "true or false"
	}
	return t.String()
}

// validate checks one job of tenant and turns it into a queue.NewJob.
// headerKey is the Idempotency-Key header ("" for batch items); bodiless
// says the job's request sends no body (GET, DELETE), so that its payload
// may be absent or null (it is then stored as null).
func (s *server) validate(tenant string, j jobRequest, headerKey string, maxPayload int64, where string, bodiless bool) (queue.NewJob, error) {
	if j.null != "" {
		return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_json", "%s%q is null: leave it out for its default, or give it a value (null is not one)", where, j.null)
	}
	if j.empty != "" {
		return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_json", "%s%q is empty: leave it out for its default, or give it a value", where, j.empty)
	}
	if len(j.Payload) == 0 || string(j.Payload) == "null" {
		if !bodiless {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "missing_payload", "%s\"payload\" is required: it is the body sent to the downstream (only a GET or DELETE request goes without one)", where)
		}
		j.Payload = json.RawMessage("null")
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
	if !validType(j.Type) {
		return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_type", "%s\"type\" must be at most 256 printable ASCII characters (a Go handler's task type, such as \"email:welcome\")", where)
	}
	cb, err := s.callback(tenant, j, where)
	if err != nil {
		return queue.NewJob{}, err
	}
	nj := queue.NewJob{Payload: j.Payload, IdempotencyKey: key, Request: normalRequest(j.Request), Type: j.Type, Callback: cb}
	if j.Cost != nil {
		if *j.Cost < 1 || *j.Cost > 1_000_000 {
			return queue.NewJob{}, errorf(http.StatusBadRequest, "invalid_cost", "%s\"cost\" must be a whole number from 1 to 1000000, got %d", where, *j.Cost)
		}
		nj.Cost = *j.Cost
	}
	at, given, err := s.deadline(j, where)
	if err != nil {
		return queue.NewJob{}, err
	}
	// The stores read the zero time (0001-01-01T00:00:00Z) as "no
	// deadline": a given deadline before 1970 is passed on as 1970, which
	// has passed just as surely. The store refuses it (would_expire) after
	// it has looked up the idempotency key, so a repeat still gets its
	// first answer.
	if epoch := time.Unix(0, 0); given && at.Before(epoch) {
		at = epoch
	}
	nj.Deadline = at
	if nj.NotBefore, err = s.notBefore(tenant, j, where); err != nil {
		return queue.NewJob{}, err
	}
	return nj, nil
}

// notBefore reads a job's "not_before" or "delay" (zero: neither, or a
// time that has come: an ordinary job). One further ahead than the
// tenant's schedule_horizon is refused (too_far_ahead), as a job that
// could never be taken.
func (s *server) notBefore(tenant string, j jobRequest, where string) (time.Time, error) {
	now := s.clock.Now()
	var at time.Time
	switch {
	case j.NotBefore != "" && j.Delay != "":
		return time.Time{}, errorf(http.StatusBadRequest, "invalid_not_before", "%ssend \"not_before\" or \"delay\", not both", where)
	case j.NotBefore != "":
		t, err := time.Parse(time.RFC3339Nano, j.NotBefore)
		if err != nil {
			return time.Time{}, errorf(http.StatusBadRequest, "invalid_not_before", "%s\"not_before\" must be an RFC 3339 time such as \"2026-03-01T09:00:00Z\": %q", where, truncate(j.NotBefore, 64))
		}
		at = t
	case j.Delay != "":
		d, err := time.ParseDuration(j.Delay)
		if err != nil || d < 0 {
			return time.Time{}, errorf(http.StatusBadRequest, "invalid_not_before", "%s\"delay\" must be a duration such as \"30s\", \"30m\" or \"36h\", not negative: %q", where, truncate(j.Delay, 64))
		}
		if d > leaky.MaxHorizon {
			d = leaky.MaxHorizon + time.Nanosecond // too far ahead, below, without overflow
		}
		at = now.Add(d)
	default:
		return time.Time{}, nil
	}
	if !at.After(now) {
		return time.Time{}, nil
	}
	ts, _ := s.config().Tenant(tenant)
	if h := ts.Horizon(); at.Sub(now) > h {
		return time.Time{}, &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonTooFarAhead, NotBefore: at, Horizon: h}
	}
	return at, nil
}

// deadline reads a job's "deadline" or "expires_in"; given is false when it
// has neither.
func (s *server) deadline(j jobRequest, where string) (at time.Time, given bool, err error) {
	switch {
	case j.Deadline != "" && j.ExpiresIn != "":
		return time.Time{}, false, errorf(http.StatusBadRequest, "invalid_deadline", "%ssend \"deadline\" or \"expires_in\", not both", where)
	case j.Deadline != "":
		at, err := time.Parse(time.RFC3339Nano, j.Deadline)
		if err != nil {
			return time.Time{}, false, errorf(http.StatusBadRequest, "invalid_deadline", "%s\"deadline\" must be an RFC 3339 time such as \"2026-03-01T12:00:00Z\": %q", where, truncate(j.Deadline, 64))
		}
		return at, true, nil
	case j.ExpiresIn != "":
		// Zero or negative is a deadline already passed (would_expire), not
		// a malformed one.
		d, err := time.ParseDuration(j.ExpiresIn)
		if err != nil || d > 366*24*time.Hour {
			return time.Time{}, false, errorf(http.StatusBadRequest, "invalid_deadline", "%s\"expires_in\" must be a duration such as \"30s\" or \"5m\", at most 366 days: %q", where, truncate(j.ExpiresIn, 64))
		}
		return s.clock.Now().Add(d), true, nil
	}
	return time.Time{}, false, nil
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
	tenant, ts, err := s.tenantFromPath(r, write)
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
	// A header given empty is refused, like "" in the body: read as no
	// key, a client's retry would be taken twice.
	if _, given := r.Header["Idempotency-Key"]; given && r.Header.Get("Idempotency-Key") == "" {
		s.fail(w, r, errorf(http.StatusBadRequest, "invalid_idempotency_key", "the Idempotency-Key header is empty: give a key (1 to 256 printable ASCII characters), or leave the header out"))
		return
	}
	nj, err := s.validate(tenant, req, r.Header.Get("Idempotency-Key"), limit, "", s.bodiless(ts, req.Request))
	var late *queue.ImpossibleError
	if errors.As(err, &late) {
		s.counted(tenant, []queue.Admission{{Impossible: late}})
	}
	if err == nil {
		err = s.checkRequest(ts, nj)
	}
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
	s.setRateLimit(w, r, tenant, ts, out)
	s.underCaps(ts, out)
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
	writeAdmission(w, status, a)
}

func (s *server) enqueueBatch(w http.ResponseWriter, r *http.Request) {
	tenant, ts, err := s.tenantFromPath(r, write)
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
	jobs, refused, err := s.validateBatch(tenant, ts, req.Jobs, cfg.Server.MaxBodyBytes)
	if err != nil {
		// Nothing of a batch with a malformed job is queued: fix it and
		// send the whole batch again.
		s.fail(w, r, err)
		return
	}
	var stored []queue.Admission
	if len(jobs) > 0 {
		if stored, err = s.store.Enqueue(r.Context(), tenant, jobs); err != nil {
			s.fail(w, r, err)
			return
		}
		s.underCaps(ts, stored)
	}
	results, out := batchResults(stored, refused, len(req.Jobs))
	s.counted(tenant, out)
	s.setRateLimit(w, r, tenant, ts, out)
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// validateBatch checks every job of a batch: the jobs for the store, and,
// by place in the batch, the refusals of the others (a deadline already
// passed, a request the downstream does not allow), which are those jobs'
// answers while the rest proceed.
func (s *server) validateBatch(tenant string, ts config.TenantSettings, reqs []jobRequest, maxPayload int64) ([]queue.NewJob, map[int]error, error) {
	jobs := make([]queue.NewJob, 0, len(reqs))
	refused := map[int]error{}
	for i, j := range reqs {
		nj, err := s.validate(tenant, j, "", maxPayload, fmt.Sprintf("jobs[%d]: ", i), s.bodiless(ts, j.Request))
		if err == nil {
			err = s.checkRequest(ts, nj)
		}
		var imp *queue.ImpossibleError
		var na *outbound.NotAllowedError
		switch {
		case errors.As(err, &imp):
			refused[i] = imp
		case errors.As(err, &na):
			refused[i] = na
		case err != nil:
			return nil, nil, err
		default:
			jobs = append(jobs, nj)
		}
	}
	return jobs, refused, nil
}

// batchResults are the answers of a batch of n jobs, in order: the store's
// (stored, in order, for the jobs not refused) and the refusals in their
// places; out are the admissions among them, for the metrics and the
// RateLimit fields (a request not allowed decides nothing of the queue).
func batchResults(stored []queue.Admission, refused map[int]error, n int) (results []map[string]any, out []queue.Admission) {
	results = make([]map[string]any, n)
	out = make([]queue.Admission, 0, n)
	for i := range n {
		var na *outbound.NotAllowedError
		var imp *queue.ImpossibleError
		switch err := refused[i]; {
		case errors.As(err, &na):
			results[i] = batchNotAllowedJSON(na)
			continue
		case errors.As(err, &imp):
			out = append(out, queue.Admission{Impossible: imp})
		default:
			out = append(out, stored[0])
			stored = stored[1:]
		}
		results[i] = batchResultJSON(out[len(out)-1])
	}
	return results, out
}

// validType reports whether t can be a job's type: empty, or up to 256
// printable ASCII characters (it becomes an asynq task's type, and is
// shown in GET /v1/jobs/{id}).
func validType(t string) bool {
	if len(t) > 256 {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < 0x20 || t[i] > 0x7e {
			return false
		}
	}
	return true
}
