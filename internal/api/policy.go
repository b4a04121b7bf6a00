package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/throttler-dev/throttler/internal/config"
)

// PolicyEditor sets and drops tenants' policies (DESIGN.md 6f): it keeps
// them in the store and puts them in force (the service).
type PolicyEditor interface {
	SetPolicy(ctx context.Context, tenant string, layer config.PolicyLayer) (config.Policy, error)
	DropPolicy(ctx context.Context, tenant string) (bool, error)
}

// policyBytes bounds a policy's body: its keys, a few windows and a URL.
const policyBytes = 64 << 10

func (s *server) policy(w http.ResponseWriter, r *http.Request) {
	tenant, _, err := s.tenantFromPath(r, read)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, policyJSON(tenant, s.config().PolicyOf(tenant), canSeeURLs(r)))
}

func (s *server) setPolicy(w http.ResponseWriter, r *http.Request) {
	tenant, err := tenantName(r, operate)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, policyBytes))
	if err != nil {
		s.fail(w, r, decodeError(err))
		return
	}
	if !json.Valid(raw) {
		s.fail(w, r, errorf(http.StatusBadRequest, "invalid_json", "the body is not JSON: send a policy such as {\"plan\": \"pro\"} or {\"rate\": \"20/s\", \"capacity\": 500}"))
		return
	}
	layer, err := config.ParsePolicyLayer(raw)
	var p config.Policy
	if err == nil {
		p, err = s.policies.SetPolicy(r.Context(), tenant, layer)
	}
	if err != nil {
		s.fail(w, r, policyError(err))
		return
	}
	// The keys set, and not callback_url's value: its query may carry a
	// token.
	s.log.Info("audit: tenant policy set", "tenant", tenant, "by", who(r), "keys", layer.Keys(), "plan", p.Plan, "rate", p.Settings.Rate.String(), "capacity", *p.Settings.Capacity)
	writeJSON(w, http.StatusOK, policyJSON(tenant, p, true))
}

func (s *server) dropPolicy(w http.ResponseWriter, r *http.Request) {
	tenant, err := tenantName(r, operate)
	if err == nil {
		err = readNothing(w, r)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.config().KnownByFile(tenant) {
		st, err := s.store.Tenant(r.Context(), tenant)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if n := st.QueueDepth + st.Scheduled + st.InFlight; n > 0 {
			s.fail(w, r, errorf(http.StatusConflict, "tenant_has_jobs",
				"tenant %q is known only by its policy (allow_unknown_tenants is false), and %d of its jobs wait or are being sent: without the policy they could no longer be read, held or cancelled; cancel them or let them go first, or name the tenant in the file", tenant, n))
			return
		}
	}
	had, err := s.policies.DropPolicy(r.Context(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !had {
		s.fail(w, r, errorf(http.StatusNotFound, "no_policy", "tenant %q has no policy set by the API: its policy is the file's", tenant))
		return
	}
	s.log.Info("audit: tenant policy dropped", "tenant", tenant, "by", who(r))
	writeJSON(w, http.StatusOK, policyJSON(tenant, s.config().PolicyOf(tenant), true))
}

// policyError is a refused policy's answer: 422 invalid_policy naming the
// key; a store's failure as any.
func policyError(err error) error {
	var ce *config.Error
	if !errors.As(err, &ce) {
		return err
	}
	return &apiError{status: http.StatusUnprocessableEntity, code: "invalid_policy", message: ce.Key + ": " + ce.Reason,
		fields: map[string]any{"field": ce.Key}}
}

// canSeeURLs reports whether the request's token may see a tenant's
// callback_url whole (an admin's, or no auth): its query may carry a
// token, which a viewer or a producer is not shown.
func canSeeURLs(r *http.Request) bool {
	t := principal(r)
	return t == nil || t.Role == config.RoleAdmin
}

// policyJSON is a tenant's policy as GET, PUT and DELETE answer it: in
// force, where each key comes from, and the API's layer (null: none);
// callback_url cut to its scheme, host and path unless whole.
func policyJSON(tenant string, p config.Policy, whole bool) map[string]any {
	ts := p.Settings
	if !whole {
		ts.CallbackURL = config.RedactURL(ts.CallbackURL)
		p.API.CallbackURL = config.RedactURL(p.API.CallbackURL)
	}
	windows := ts.Windows
	if windows == nil {
		windows = []string{}
	}
	var plan, planFrom, api any
	if p.Plan != "" {
		plan, planFrom = p.Plan, p.PlanFrom
	}
	if p.HasAPI {
		api = p.API
	}
	var maxAttempts any // null: the downstream's
	if ts.MaxAttempts != nil {
		maxAttempts = *ts.MaxAttempts
	}
	return map[string]any{
		"tenant":    tenant,
		"plan":      plan,
		"plan_from": planFrom,
		"policy": map[string]any{
			"downstream":       ts.Downstream,
			"mode":             ts.Mode,
			"rate":             ts.Rate.String(),
			"capacity":         *ts.Capacity,
			"burst":            *ts.Burst,
			"windows":          slices.Clone(windows),
			"max_attempts":     maxAttempts,
			"max_in_flight":    ts.InFlightCap(),
			"max_scheduled":    ts.ScheduledCap(),
			"schedule_horizon": ts.Horizon().String(),
			"callback_url":     ts.CallbackURL,
		},
		"from": p.From,
		"api":  api,
	}
}
