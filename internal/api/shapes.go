package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// writeJSON answers v as JSON with status: every answer of the API, errors
// included, goes out here.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// writeAdmission answers an admission (as writeJSON(w, status,
// admissionJSON(a)) would, byte for byte) without reflection or a map: it
// is the answer to every enqueue.
func writeAdmission(w http.ResponseWriter, status int, a queue.Admission) {
	bp := answerBufs.Get().(*[]byte)
	b, ok := appendAdmission((*bp)[:0], a)
	if !ok {
		writeJSON(w, status, admissionJSON(a))
	} else {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(b)
	}
	*bp = b
	answerBufs.Put(bp)
}

var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// appendAdmission appends what json.Encoder writes for admissionJSON(a):
// its keys in order, a newline after. False if a field needs what only
// encoding/json does (escapes, a year past 9999).
func appendAdmission(b []byte, a queue.Admission) ([]byte, bool) {
	j := a.Job
	dispatchAt := j.DispatchAt
	if a.Duplicate {
		dispatchAt = j.EnqueuedAt.Add(j.AdmitDelay)
	}
	dispatchAt = dispatchAt.UTC()
	if y := dispatchAt.Year(); y < 0 || y > 9999 || !plainJSON(j.ID) || !plainJSON(j.Tenant) || !plainJSON(string(j.State)) || !plainJSON(a.LimitedBy) || !j.NotBefore.IsZero() {
		return b, false
	}
	b = append(b, `{"capacity":`...)
	b = strconv.AppendInt(b, int64(a.Capacity), 10)
	b = append(b, `,"dispatch_at":"`...)
	b = dispatchAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","expected_delay_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(a.ExpectedDelay), 10)
	b = append(b, `,"id":"`...)
	b = append(b, j.ID...)
	if a.LimitedBy != "" {
		b = append(b, `","limited_by":"`...)
		b = append(b, a.LimitedBy...)
	}
	b = append(b, `","queue_depth":`...)
	b = strconv.AppendInt(b, int64(a.QueueDepth), 10)
	b = append(b, `,"state":"`...)
	b = append(b, j.State...)
	b = append(b, `","tenant":"`...)
	b = append(b, j.Tenant...)
	return append(b, "\"}\n"...), true
}

// plainJSON reports whether s is a JSON string's content as it is: printable
// ASCII that encoding/json would not escape.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// ceilMillis is d in whole milliseconds, rounded up (DESIGN.md: durations in
// JSON are rounded up).
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// admissionJSON is the answer to one admitted job (202, or 200 for a
// repeated idempotency key: the first answer again).
func admissionJSON(a queue.Admission) map[string]any {
	j := a.Job
	dispatchAt := j.DispatchAt
	if a.Duplicate {
		dispatchAt = j.EnqueuedAt.Add(j.AdmitDelay) // the first answer, again
	}
	m := map[string]any{
		"id":                j.ID,
		"tenant":            j.Tenant,
		"state":             j.State,
		"dispatch_at":       dispatchAt.UTC(),
		"expected_delay_ms": ceilMillis(a.ExpectedDelay),
		"queue_depth":       a.QueueDepth,
		"capacity":          a.Capacity,
	}
	if a.LimitedBy != "" {
		m["limited_by"] = a.LimitedBy
	}
	if !j.NotBefore.IsZero() {
		m["not_before"] = j.NotBefore.UTC()
	}
	return m
}

func (s *server) tenantJSON(st queue.TenantStatus, ts config.TenantSettings) map[string]any {
	p := ts.Policy()
	if d, ok := s.inFlightWait(ts, st.QueueDepth+st.InFlight); ok && d > st.ExpectedDelay && !st.Paused {
		st.ExpectedDelay, st.LimitedBy = d, rules.LimitInFlight
	}
	var pausedUntil any // null: not paused, or an operator hold with no end
	if !st.PausedUntil.IsZero() {
		pausedUntil = st.PausedUntil.UTC().Format(time.RFC3339Nano)
	}
	var ownerAt any // null: its partition has an owner (always, on the embedded store)
	if !st.OwnerAt.IsZero() {
		ownerAt = st.OwnerAt.UTC().Format(time.RFC3339Nano)
	}
	return map[string]any{
		"tenant":               st.Tenant,
		"mode":                 ts.Mode,
		"rate_per_second":      ts.Rate.PerSecond(),
		"burst":                p.Burst,
		"capacity":             p.Capacity,
		"downstream":           ts.Downstream,
		"queue_depth":          st.QueueDepth,
		"scheduled":            st.Scheduled,
		"max_scheduled":        ts.ScheduledCap(),
		"in_flight":            st.InFlight,
		"expected_delay_ms":    ceilMillis(st.ExpectedDelay),
		"limited_by":           st.LimitedBy,
		"max_in_flight":        ts.InFlightCap(),
		"paused":               st.Paused,
		"paused_until":         pausedUntil,
		"held":                 st.Held,
		"awaiting_owner_until": ownerAt,
		"accepted_total":       st.Accepted,
		"rejected_total":       st.Rejected,
		"delivered_total":      st.Delivered,
		"failed_total":         st.Failed,
		"cancelled_total":      st.Cancelled,
		"expired_total":        st.Expired,
	}
}

func jobJSON(j queue.Job) map[string]any {
	var finished, sent, lastErr, status, deadline, notBefore any
	if !j.Deadline.IsZero() {
		deadline = j.Deadline.UTC()
	}
	if !j.NotBefore.IsZero() {
		notBefore = j.NotBefore.UTC()
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
	m := map[string]any{
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
		"not_before":      notBefore,
	}
	if j.Request != nil {
		m["request"] = requestJSON(j.Request)
	}
	if j.Type != "" {
		m["type"] = j.Type
	}
	if j.Response != nil {
		m["response"] = responseJSON(j.Response)
	}
	if cb := callbackJSON(j); cb != nil {
		m["callback"] = cb
	}
	return m
}

// JobJSON is a job as GET /v1/jobs/{id} shows it (a callback's "job").
func JobJSON(j queue.Job) map[string]any { return jobJSON(j) }

// requestJSON is what a job asked of its downstream's request, the parts
// it gave: its method, path, query (each name's values, in order) and the
// headers its downstream allows a job to set. Nothing of the downstream's
// own request (its auth, its static headers) is on the job to show.
func requestJSON(r *queue.JobRequest) map[string]any {
	m := map[string]any{}
	if r.Method != "" {
		m["method"] = r.Method
	}
	if r.Path != "" {
		m["path"] = r.Path
	}
	if len(r.Query) > 0 {
		q := make(map[string][]string, len(r.Query))
		for name, values := range r.Query {
			q[name] = append([]string{}, values...)
		}
		m["query"] = q
	}
	if len(r.Headers) > 0 {
		h := make(map[string]string, len(r.Headers))
		for name, v := range r.Headers {
			h[name] = v
		}
		m["headers"] = h
	}
	return m
}

// responseJSON is what was kept of the downstream's answer to the latest
// attempt: its status, the headers its downstream keeps, the start of its
// body (as text, or in base64 when it is not UTF-8) and whether the body
// was longer. It never holds anything of the request.
func responseJSON(r *queue.Response) map[string]any {
	h := make(map[string]string, len(r.Headers))
	for name, v := range r.Headers {
		h[name] = v
	}
	m := map[string]any{"status": r.Status, "headers": h, "truncated": r.Truncated}
	switch {
	case r.BodyBase64 != "":
		m["body_base64"] = r.BodyBase64
	default:
		m["body"] = r.Body
	}
	return m
}

// batchNotAllowedJSON is the answer of a job of a batch whose request (or
// payload) its downstream does not allow: what the single endpoint would
// have answered (422), with its status beside it.
func batchNotAllowedJSON(e *outbound.NotAllowedError) map[string]any {
	m := notAllowedFields(e)
	m["status"] = http.StatusUnprocessableEntity
	m["error"] = e.Code
	m["message"] = notAllowedMessage(e)
	return m
}

// batchResultJSON is one job's answer in a batch: what the single endpoint
// would have answered, with its status beside it.
func batchResultJSON(a queue.Admission) map[string]any {
	switch {
	case a.Rejected != nil:
		m := rejectionFields(a.Rejected)
		m["status"] = http.StatusTooManyRequests
		m["error"] = a.Rejected.Reason
		m["message"] = rejectionMessage(a.Rejected)
		return m
	case a.Impossible != nil:
		m := impossibleFields(a.Impossible)
		m["status"] = http.StatusUnprocessableEntity
		m["error"] = a.Impossible.Reason
		m["message"] = a.Impossible.Error()
		return m
	}
	m := admissionJSON(a)
	m["status"] = http.StatusAccepted
	if a.Duplicate {
		m["status"] = http.StatusOK
	}
	return m
}

// inFlightWait estimates how long a tenant's job waits behind ahead of its
// jobs under its caps on attempts in flight (the lower of its own and its
// downstream's): they go that many at a time, each taking the
// downstream's recent latency as this process saw it. False: no cap, or
// no latency seen here (an API-only process on Redis), where only the
// rate's wait, which is exact, is told.
func (s *server) inFlightWait(ts config.TenantSettings, ahead int) (time.Duration, bool) {
	c := ts.InFlightCap()
	if shared := s.config().Downstreams[ts.Downstream].MaxInFlight; shared > 0 && (c == 0 || shared < c) {
		c = shared
	}
	if c == 0 || s.metrics == nil {
		return 0, false
	}
	latency, ok := s.metrics.RecentLatency(ts.Downstream)
	if !ok {
		return 0, false
	}
	return time.Duration(ahead/c) * latency, true
}

// underCaps tells each admitted job of out whose wait a cap on attempts
// in flight makes longer than the rate's: its estimate, and limited_by.
func (s *server) underCaps(ts config.TenantSettings, out []queue.Admission) {
	for i, a := range out {
		if !a.Admitted() || a.Duplicate {
			continue
		}
		if d, ok := s.inFlightWait(ts, max(a.QueueDepth-1, 0)); ok && d > a.ExpectedDelay {
			out[i].ExpectedDelay, out[i].LimitedBy = d, rules.LimitInFlight
		}
	}
}
