package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
)

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
	var na *outbound.NotAllowedError
	var full *queue.StoreFullError
	switch {
	case errors.As(err, &ae):
		writeError(w, ae.status, ae.code, ae.message, ae.fields)
	case errors.As(err, &rej):
		if rej.Reason != queue.ReasonScheduleFull { // room comes at no time it could name
			w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(rej.RetryAfter), 10))
		}
		writeError(w, http.StatusTooManyRequests, rej.Reason, rejectionMessage(rej), rejectionFields(rej))
	case errors.As(err, &imp):
		writeError(w, http.StatusUnprocessableEntity, imp.Reason, imp.Error(), impossibleFields(imp))
	case errors.As(err, &na):
		writeError(w, http.StatusUnprocessableEntity, na.Code, notAllowedMessage(na), notAllowedFields(na))
	case errors.As(err, &se):
		writeError(w, http.StatusConflict, "not_cancellable", se.Error()+": only queued or retrying jobs can be cancelled", map[string]any{"id": se.ID, "state": se.State})
	case errors.As(err, &full):
		// Not logged per request: the store logs the change of state once.
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(full.RetryAfter), 10))
		writeError(w, http.StatusInsufficientStorage, "store_full", full.Error(), storeFullFields(full))
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
	switch r.Reason {
	case queue.ReasonScheduleFull:
		return fmt.Sprintf("tenant %s has %d jobs scheduled for later, its max_scheduled: send this one again once some of them have gone, or raise max_scheduled", r.Tenant, r.Scheduled)
	case queue.ReasonRateLimited:
		return fmt.Sprintf("tenant %s has no token left; retry after %v", r.Tenant, r.RetryAfter.Round(time.Millisecond))
	}
	return fmt.Sprintf("tenant %s has %d jobs waiting, its capacity; retry after %v", r.Tenant, r.Capacity, r.RetryAfter.Round(time.Millisecond))
}

// notAllowedMessage says what of the job its downstream does not allow
// and what it does (the config key); it never holds a header's value or a
// secret (outbound.NotAllowedError holds neither).
func notAllowedMessage(e *outbound.NotAllowedError) string {
	return e.Error() + "; nothing was queued"
}

// notAllowedFields name the job's part that was refused: "payload",
// "request.path", "request.headers.X-Foo"...
func notAllowedFields(e *outbound.NotAllowedError) map[string]any {
	return map[string]any{"part": e.Part}
}

// impossibleFields say what a 422 would have needed.
func impossibleFields(e *queue.ImpossibleError) map[string]any {
	switch e.Reason {
	case queue.ReasonCostTooLarge:
		return map[string]any{"cost": e.Cost, "max_cost": e.MaxCost}
	case queue.ReasonTooFarAhead:
		return map[string]any{"tenant": e.Tenant, "not_before": e.NotBefore.UTC().Format(time.RFC3339Nano), "schedule_horizon": e.Horizon.String()}
	}
	// Formatted here rather than by encoding/json, which refuses years
	// before 0 ("0000-01-01T00:00:00+01:00" is one in UTC) and would leave
	// the answer without a body.
	return map[string]any{"expected_delay_ms": ceilMillis(e.ExpectedDelay), "deadline": e.Deadline.UTC().Format(time.RFC3339Nano)}
}

func rejectionFields(r *queue.RejectedError) map[string]any {
	if r.Reason == queue.ReasonScheduleFull {
		return map[string]any{"tenant": r.Tenant, "scheduled": r.Scheduled, "max_scheduled": r.MaxScheduled}
	}
	return map[string]any{"retry_after_ms": ceilMillis(r.RetryAfter), "queue_depth": r.QueueDepth, "capacity": r.Capacity}
}

func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// storeFullFields say how full: the room left and the reserve, in bytes.
func storeFullFields(e *queue.StoreFullError) map[string]any {
	if e.Redis != "" { // Redis's room is its maxmemory, named in the message
		return map[string]any{"retry_after_ms": ceilMillis(e.RetryAfter)}
	}
	return map[string]any{"retry_after_ms": ceilMillis(e.RetryAfter), "free_bytes": e.Free, "reserve_bytes": e.Reserve}
}
