package api

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

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
	wait, err := parseJobWait(r)
	var j queue.Job
	if err == nil {
		j, err = s.jobFromPath(r, read)
	}
	if err == nil && wait > 0 && !j.State.Finished() {
		j, err = s.waitFinished(w, r, j, wait)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, jobJSON(j))
}

// MaxJobWait is the longest GET /v1/jobs/{id}?wait holds a request.
const MaxJobWait = 60 * time.Second

// waitersPerSlot: requests that wait (?wait) may number this many times
// server.max_concurrent_requests.
const waitersPerSlot = 16

// rereadEvery is how often a waiting request reads its job again, in case
// the notice of its final state was lost (a dropped Redis connection).
const rereadEvery = time.Second

// isJobWait reports whether r waits for a job to finish.
func isJobWait(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/jobs/") && r.URL.Query().Has("wait")
}

// parseJobWait reads ?wait (0 if absent): a Go duration ("30s", "500ms")
// or whole seconds ("30"), at most MaxJobWait.
func parseJobWait(r *http.Request) (time.Duration, error) {
	q := r.URL.Query()
	if !q.Has("wait") {
		return 0, nil
	}
	v := q.Get("wait")
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseUint(v, 10, 32)
		if nerr != nil {
			return 0, errorf(http.StatusBadRequest, "invalid_wait", "wait=%q: give a duration such as wait=30s or wait=500ms (at most %v)", v, MaxJobWait)
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 || d > MaxJobWait {
		return 0, errorf(http.StatusBadRequest, "invalid_wait", "wait=%q: from 0 to %v", v, MaxJobWait)
	}
	return d, nil
}

// waitFinished waits until job j is in a final state, or wait has passed,
// or the client gave up, and returns the job as it is then. It watches
// before it reads, so that a final state written in between is not missed;
// it reads again every rereadEvery in case a notice was lost.
func (s *server) waitFinished(w http.ResponseWriter, r *http.Request, j queue.Job, wait time.Duration) (queue.Job, error) {
	// The answer comes after the wait: the server's write timeout (a
	// minute) must not cut it off.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 30*time.Second))
	ctx := r.Context()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		finished, stop := s.store.WatchFinish(j.ID)
		cur, err := s.store.Job(ctx, j.ID)
		if err != nil || cur.State.Finished() {
			stop()
			return cur, err
		}
		j = cur
		reread := time.NewTimer(rereadEvery)
		select {
		case <-finished:
		case <-reread.C:
		case <-deadline.C:
			stop()
			reread.Stop()
			return s.store.Job(ctx, j.ID) // the state then
		case <-ctx.Done():
			stop()
			reread.Stop()
			return j, nil // the client is gone: nobody reads the answer
		}
		stop()
		reread.Stop()
	}
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
	if err == nil {
		// A retry takes a place like a new job: its answer says what is left.
		if ts, ok := s.config().Tenant(j.Tenant); ok {
			s.setRateLimit(w, r, j.Tenant, ts, []queue.Admission{a})
			out := []queue.Admission{a}
			s.underCaps(ts, out)
			a = out[0]
		}
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
