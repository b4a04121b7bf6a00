package api

import (
	"errors"
	"net/http"

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
	if err == nil {
		// A retry takes a place like a new job: its answer says what is left.
		if ts, ok := s.config().Tenant(j.Tenant); ok {
			s.setRateLimit(w, r, j.Tenant, ts, []queue.Admission{a})
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
