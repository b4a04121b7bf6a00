package api

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/metrics"
)

// The reads the status page needs beside the tenant and job routes: who the
// token is, the downstreams, and the last minutes of the busiest tenants
// (kept in memory by metrics.Recent: see its doc for the bounds).

// maxHistoryTenants is the most tenants one GET /v1/history may name.
const maxHistoryTenants = 100

// statusRoutes adds the status page's own routes.
func (s *server) statusRoutes(rt *routes) {
	rt.handle("GET", "/v1/whoami", s.whoami)
	rt.handle("GET", "/v1/downstreams", s.downstreams)
	rt.handle("GET", "/v1/history", s.history)
}

// whoami says what the request's token may do, so that a page shows only
// the buttons that will work.
func (s *server) whoami(w http.ResponseWriter, r *http.Request) {
	t := principal(r)
	if t == nil {
		writeJSON(w, http.StatusOK, map[string]any{"auth": false, "name": nil, "role": config.RoleAdmin,
			"tenants": []string{"*"}, "all_tenants": true, "can_retry": true, "can_hold": true})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"auth": true, "name": t.Name, "role": t.Role, "tenants": t.Tenants,
		"all_tenants": t.AllTenants(), "can_retry": t.Role != config.RoleViewer, "can_hold": t.Role == config.RoleAdmin})
}

// allTenants refuses a token scoped to some tenants: what it asks spans
// them all.
func allTenants(r *http.Request, what string) error {
	if t := principal(r); t != nil && !t.AllTenants() {
		return errorf(http.StatusForbidden, "forbidden", "token %q is scoped to some tenants; %s needs a token for all (\"*\")", t.Name, what)
	}
	return nil
}

// downstreams reports each downstream: its ceiling, its breaker, and this
// process's attempts by class and pushbacks, now and over the last minutes.
func (s *server) downstreams(w http.ResponseWriter, r *http.Request) {
	if err := allTenants(r, "/v1/downstreams"); err != nil {
		s.fail(w, r, err)
		return
	}
	cfg := s.config()
	var rc *metrics.Recent
	if s.metrics != nil {
		rc = s.metrics.Recent()
	}
	var samples map[string][]metrics.DownstreamSample
	if rc != nil {
		samples = rc.Downstreams()
	}
	names := make([]string, 0, len(cfg.Downstreams))
	for name := range cfg.Downstreams {
		names = append(names, name)
	}
	slices.Sort(names)
	items := make([]map[string]any, 0, len(names))
	for _, name := range names {
		items = append(items, downstreamJSON(name, cfg.Downstreams[name], samples[name]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"downstreams": items, "classes": metrics.Classes,
		"interval_ms": recentEvery(rc), "window_ms": recentWindow(rc), "now_ms": time.Now().UnixMilli()})
}

func downstreamJSON(name string, d config.Downstream, samples []metrics.DownstreamSample) map[string]any {
	var ceiling any
	if c := d.Ceiling(); c != nil {
		var perSecond any
		if d.Rate != nil {
			perSecond = d.Rate.PerSecond()
		}
		ceiling = map[string]any{"rate_per_second": perSecond, "burst": c.Burst, "windows": d.Windows}
	}
	at := make([]int64, len(samples))
	pushbacks := make([]float64, len(samples))
	breaker := make([]bool, len(samples))
	attempts := map[string][]float64{}
	for _, c := range metrics.Classes {
		attempts[c] = make([]float64, len(samples))
	}
	for i, sm := range samples {
		at[i], pushbacks[i], breaker[i] = sm.At.UnixMilli(), sm.Pushbacks, sm.BreakerOpen
		for _, c := range metrics.Classes {
			attempts[c][i] = sm.Attempts[c]
		}
	}
	now := map[string]any{"breaker_open": false, "attempts_total": map[string]float64{}, "pushbacks_total": 0.0, "announced_holds_total": 0.0}
	if n := len(samples); n > 0 {
		last := samples[n-1]
		now = map[string]any{"breaker_open": last.BreakerOpen, "attempts_total": last.Attempts, "pushbacks_total": last.Pushbacks, "announced_holds_total": last.Announced}
	}
	out := map[string]any{"name": name, "ceiling": ceiling, "max_attempts": d.MaxAttempts, "max_in_flight": d.MaxInFlight,
		"rate_limit_headers": cmp.Or(d.RateLimitHeaders, "off"), "rate_limit_scope": cmp.Or(d.RateLimitScope, "tenant"),
		"history": map[string]any{"t": at, "attempts": attempts, "pushbacks": pushbacks, "breaker_open": breaker}}
	for k, v := range now {
		out[k] = v
	}
	return out
}

// history gives the last minutes of the tenants named (?tenant=a&tenant=b):
// depth, in flight, expected delay and the delivered and failed totals, at
// each sample. Tenants not among the busiest are not kept, and are left out.
func (s *server) history(w http.ResponseWriter, r *http.Request) {
	names := r.URL.Query()["tenant"]
	if len(names) > maxHistoryTenants {
		s.fail(w, r, errorf(http.StatusBadRequest, "invalid_parameter", "at most %d tenant parameters, got %d", maxHistoryTenants, len(names)))
		return
	}
	for _, n := range names {
		if !config.ValidName(n) {
			s.fail(w, r, errorf(http.StatusBadRequest, "invalid_tenant", "tenant name %q is not valid", truncate(n, 140)))
			return
		}
		if err := authorize(r, n, read); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	var rc *metrics.Recent
	if s.metrics != nil {
		rc = s.metrics.Recent()
	}
	out := map[string]any{}
	if rc != nil {
		for name, samples := range rc.Tenants(names) {
			out[name] = tenantHistoryJSON(samples)
		}
	}
	// now_ms: the server's clock, the right end of the charts (the
	// browser's clock may be off).
	writeJSON(w, http.StatusOK, map[string]any{"tenants": out, "interval_ms": recentEvery(rc), "window_ms": recentWindow(rc),
		"now_ms": time.Now().UnixMilli()})
}

func tenantHistoryJSON(samples []metrics.TenantSample) map[string]any {
	n := len(samples)
	at, depth, inFlight, delay := make([]int64, n), make([]int, n), make([]int, n), make([]int64, n)
	delivered, failed := make([]int64, n), make([]int64, n)
	for i, sm := range samples {
		at[i], depth[i], inFlight[i], delay[i] = sm.At.UnixMilli(), sm.Depth, sm.InFlight, ceilMillis(sm.Delay)
		delivered[i], failed[i] = sm.Delivered, sm.Failed
	}
	return map[string]any{"t": at, "depth": depth, "in_flight": inFlight, "expected_delay_ms": delay,
		"delivered_total": delivered, "failed_total": failed}
}

func recentEvery(rc *metrics.Recent) int64 {
	if rc == nil {
		return 0
	}
	return rc.Every().Milliseconds()
}

func recentWindow(rc *metrics.Recent) int64 {
	if rc == nil {
		return 0
	}
	return int64(rc.Window() / time.Millisecond)
}
