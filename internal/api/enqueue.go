package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"throttler/internal/queue"
)

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

// validate checks one job of tenant and turns it into a queue.NewJob.
// headerKey is the Idempotency-Key header ("" for batch items).
func (s *server) validate(tenant string, j jobRequest, headerKey string, maxPayload int64, where string) (queue.NewJob, error) {
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
	return nj, nil
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
	nj, err := s.validate(tenant, req, r.Header.Get("Idempotency-Key"), limit, "")
	var late *queue.ImpossibleError
	if errors.As(err, &late) {
		s.counted(tenant, []queue.Admission{{Impossible: late}})
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
	jobs, late, err := s.validateBatch(tenant, req.Jobs, cfg.Server.MaxBodyBytes)
	if err != nil {
		// Nothing of a batch with a bad job is queued: fix it and send the
		// whole batch again.
		s.fail(w, r, err)
		return
	}
	var stored []queue.Admission
	if len(jobs) > 0 {
		if stored, err = s.store.Enqueue(r.Context(), tenant, jobs); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	out := withLate(stored, late, len(req.Jobs))
	s.counted(tenant, out)
	s.setRateLimit(w, r, tenant, ts, out)
	results := make([]map[string]any, len(out))
	for i, a := range out {
		results[i] = batchResultJSON(a)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// validateBatch checks every job of a batch: the jobs for the store, and
// the answers of those already past their deadline, by place in the batch.
func (s *server) validateBatch(tenant string, reqs []jobRequest, maxPayload int64) ([]queue.NewJob, map[int]*queue.ImpossibleError, error) {
	jobs := make([]queue.NewJob, 0, len(reqs))
	late := map[int]*queue.ImpossibleError{}
	for i, j := range reqs {
		nj, err := s.validate(tenant, j, "", maxPayload, fmt.Sprintf("jobs[%d]: ", i))
		var imp *queue.ImpossibleError
		switch {
		case errors.As(err, &imp):
			late[i] = imp
		case err != nil:
			return nil, nil, err
		default:
			jobs = append(jobs, nj)
		}
	}
	return jobs, late, nil
}

// withLate puts the answers of the late jobs back in their places among the
// store's answers (stored, in order, for the others of n).
func withLate(stored []queue.Admission, late map[int]*queue.ImpossibleError, n int) []queue.Admission {
	if len(late) == 0 {
		return stored
	}
	out := make([]queue.Admission, 0, n)
	for i := range n {
		if imp, ok := late[i]; ok {
			out = append(out, queue.Admission{Impossible: imp})
			continue
		}
		out = append(out, stored[0])
		stored = stored[1:]
	}
	return out
}
