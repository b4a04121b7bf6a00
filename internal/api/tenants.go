package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

// tenantFromPath validates the {tenant} path segment, checks that the
// request's token may do a to it, and finds its settings.
func (s *server) tenantFromPath(r *http.Request, a access) (string, config.TenantSettings, error) {
	name, err := tenantName(r, a)
	if err != nil {
		return "", config.TenantSettings{}, err
	}
	ts, ok := s.config().Tenant(name)
	if !ok {
		return "", config.TenantSettings{}, errorf(http.StatusNotFound, "unknown_tenant",
			"tenant %q is not configured and allow_unknown_tenants is false (an admin can give it a policy: PUT /v1/tenants/%s/policy)", name, name)
	}
	return name, ts, nil
}

// tenantName is the {tenant} path segment, validated, once the request's
// token may do a to it. The tenant need not be known (a policy may make
// it so).
func tenantName(r *http.Request, a access) (string, error) {
	name := r.PathValue("tenant")
	if !config.ValidName(name) {
		return "", errorf(http.StatusBadRequest, "invalid_tenant",
			"tenant name %q is not valid: use 1 to 128 ASCII letters, digits or . _ - + @", truncate(name, 140))
	}
	return name, authorize(r, name, a)
}

// tenantPaths refuses a path under /v1/tenants/ with a "." or ".." segment
// or an empty one, 400 invalid_tenant, before the mux cleans it and
// redirects there: a client that follows the redirect would reach another
// tenant, or another route, than the one it named. "." and ".." are not
// tenant names (config.ValidName), and a job's tenant is never found by
// walking a path.
func tenantPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1/tenants/")
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		segs := strings.Split(rest, "/")
		for i, seg := range segs {
			if seg == "." || seg == ".." || (seg == "" && i < len(segs)-1) || (seg == "" && i == 0) {
				writeError(w, http.StatusBadRequest, "invalid_tenant", fmt.Sprintf("path %q has a \".\", \"..\" or empty segment: name the tenant itself (1 to 128 ASCII letters, digits or . _ - + @, not . or ..) in /v1/tenants/{tenant}", truncate(r.URL.Path, 200)), nil)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
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
	q := r.URL.Query()
	if !q.Has(name) {
		return def, nil
	}
	// Given empty (?limit=), it is not left out: the client meant a value
	// it did not send, and the default may not be what it meant.
	v := q.Get(name)
	if v == "" {
		return 0, errorf(http.StatusBadRequest, "invalid_parameter", "%s is empty: give a whole number from %d to %d, or leave it out for %d", name, lo, hi, def)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, errorf(http.StatusBadRequest, "invalid_parameter", "%s must be a whole number from %d to %d", name, lo, hi)
	}
	return n, nil
}

// hold pauses (an operator hold: nothing of the tenant is sent until
// resumed; it keeps accepting while it has room) or resumes a tenant.
func (s *server) hold(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ts, err := s.tenantFromPath(r, operate)
		if err == nil {
			err = readNothing(w, r)
		}
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

// nothingBytes bounds the body of a request that takes none (pause,
// resume): room for {} and whitespace, not for a client's mistake.
const nothingBytes = 1 << 10

// readNothing reads the body of a request that takes none: empty, or {}
// (clients send {} as often as nothing). Anything else is refused, 400,
// rather than ignored: a client that sent fields meant something by them.
func readNothing(w http.ResponseWriter, r *http.Request) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, nothingBytes))
	if err != nil {
		return decodeError(err)
	}
	if len(raw) == 0 {
		return nil
	}
	// Whitespace alone is a body, and not JSON. json.Unmarshal, not a
	// Decoder: a Decoder stops after the object, and its More does not see
	// a stray "}" or "]" after it ("{}}" is not JSON either).
	var fields map[string]json.RawMessage
	if trimmed := bytes.TrimSpace(raw); len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(raw, &fields) != nil {
		return errorf(http.StatusBadRequest, "invalid_json", "this request takes no body, or {}: got %q", truncate(string(raw), 40))
	}
	for name := range fields {
		return errorf(http.StatusBadRequest, "unknown_field", "unknown field %q: this request takes no body, or {}", truncate(name, 40))
	}
	return nil
}
