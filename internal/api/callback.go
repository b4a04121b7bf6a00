package api

import (
	"net/http"
	"net/url"
	"slices"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

// maxCallbackURL bounds a callback_url's length.
const maxCallbackURL = 2048

// callback is the callback a job of tenant asks for (DESIGN.md section
// 6b): its own callback_url, else its tenant's, told on its callback_on
// states (nil: all four). A URL outside callbacks.allow is refused with
// 422 callback_not_allowed, before anything is queued.
func (s *server) callback(tenant string, j jobRequest, where string) (*queue.JobCallback, error) {
	var cfg *config.Config
	if s.config != nil {
		cfg = s.config()
	} else {
		cfg = config.Default() // a server built without config (the fuzz target's): no callbacks
	}
	ts, _ := cfg.Tenant(tenant)
	u := j.CallbackURL
	if u == "" {
		u = ts.CallbackURL
	}
	var on []queue.JobState
	if j.CallbackOn != nil {
		if len(j.CallbackOn) == 0 {
			return nil, errorf(http.StatusBadRequest, "invalid_callback_on", "%s\"callback_on\" is empty: name the final states to tell (succeeded, failed, expired, cancelled), or leave it out for all four", where)
		}
		for _, st := range j.CallbackOn {
			if !slices.Contains(queue.FinalStates, queue.JobState(st)) {
				return nil, errorf(http.StatusBadRequest, "invalid_callback_on", "%s\"callback_on\" holds %q: each must be succeeded, failed, expired or cancelled", where, truncate(st, 32))
			}
			if !slices.Contains(on, queue.JobState(st)) {
				on = append(on, queue.JobState(st))
			}
		}
		if u == "" {
			return nil, errorf(http.StatusBadRequest, "invalid_callback_on", "%s\"callback_on\" needs a \"callback_url\" (the job's, or its tenant's callback_url in the config)", where)
		}
	}
	if u == "" {
		return nil, nil
	}
	if j.CallbackURL == "" {
		return &queue.JobCallback{URL: u, On: on}, nil // the tenant's: checked at config load
	}
	notAllowed := func(why string) error {
		e := errorf(http.StatusUnprocessableEntity, "callback_not_allowed", "%s\"callback_url\" %s; nothing was queued", where, why)
		e.fields = map[string]any{"allow": cfg.Callbacks.Allow}
		return e
	}
	parsed, err := url.Parse(u)
	switch {
	case !cfg.Callbacks.Enabled():
		return nil, notAllowed("cannot be used: callbacks are not configured on this service (a [callbacks] section with signing_secret_env and allow)")
	case len(u) > maxCallbackURL:
		return nil, notAllowed("is longer than 2048 bytes")
	case err != nil || !parsed.IsAbs() || parsed.Host == "" || parsed.User != nil || parsed.Fragment != "":
		return nil, notAllowed("must be an absolute http or https URL, without user info or fragment")
	case !cfg.Callbacks.Allowed(u):
		return nil, notAllowed("does not start with any of the prefixes in callbacks.allow")
	}
	return &queue.JobCallback{URL: u, On: on}, nil
}

// callbackJSON is the callback a job owes, for GET /v1/jobs/{id}: nil
// when its end owes none (none asked, or not ended yet: then its URL
// alone, as "pending" would mislead).
func callbackJSON(j queue.Job) map[string]any {
	if j.Callback == nil {
		return nil
	}
	m := map[string]any{"url": j.Callback.URL, "state": nil, "attempts": 0, "last_error": nil}
	if len(j.Callback.On) > 0 {
		m["on"] = j.Callback.On
	}
	if st := j.CallbackStatus; st != nil {
		m["state"], m["attempts"] = st.State, st.Attempts
		if st.LastError != "" {
			m["last_error"] = st.LastError
		}
	}
	return m
}
