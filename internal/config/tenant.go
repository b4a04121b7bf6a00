package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// Modes of a tenant's bucket.
const (
	ModeLeaky = "leaky"
	ModeToken = "token"
)

// TenantSettings are the settings of one tenant, or the defaults of all.
// A key a named tenant leaves out comes from tenant_defaults.
type TenantSettings struct {
	// Plan names a [plans.NAME] whose keys this one takes where it leaves
	// them out (tenant_defaults and [tenants.NAME]; not a plan itself).
	// Default none.
	Plan string `toml:"plan"`
	// Downstream names the target. Default: the only downstream configured.
	Downstream string `toml:"downstream"`
	// Mode is "leaky" (default) or "token".
	Mode string `toml:"mode"`
	// Rate is N/DURATION. Default "1/s".
	Rate *leaky.Rate `toml:"rate"`
	// Capacity is how many jobs may wait (leaky mode). Default 10.
	// Capacity and Burst together may schedule at most leaky.MaxHorizon
	// (10 years) ahead: (capacity + burst - 1) intervals of the rate.
	Capacity *int `toml:"capacity"`
	// Burst is how many may go at once after a quiet spell. Default 1.
	Burst *int `toml:"burst"`
	// Windows are limits beside the rate such as "100/h" or "1000/d":
	// never more than N sends in any window of that length. Jobs wait for
	// room; they are not refused for it.
	Windows []string       `toml:"windows"`
	windows []leaky.Window // parsed by checkTenant
	// MaxAttempts overrides the downstream's max_attempts for this tenant.
	MaxAttempts *int `toml:"max_attempts"`
	// MaxInFlight caps the tenant's attempts in flight: none starts while
	// that many are open (from the hand-over to the send until the outcome
	// is recorded). 0: no cap. Default 0.
	MaxInFlight *int `toml:"max_in_flight"`
	// MaxScheduled bounds the tenant's jobs booked for a not_before (they
	// take no place of capacity): past it, 429 schedule_full. Default
	// 10000.
	MaxScheduled *int `toml:"max_scheduled"`
	// ScheduleHorizon is how far ahead a job's not_before may be: past
	// it, 422 too_far_ahead. Default "720h" (30 days).
	ScheduleHorizon *Duration `toml:"schedule_horizon"`
	// CallbackURL is where the tenant's jobs' ends are told when a job
	// names none (DESIGN.md 6b); it must start with one of callbacks.allow.
	// Default none.
	CallbackURL string `toml:"callback_url"`
	// AllowUnknownTenants (tenant_defaults only): false refuses tenants not
	// named in [tenants.*] with 404. Default true.
	AllowUnknownTenants *bool `toml:"allow_unknown_tenants"`
}

// Attempts is the tenant's max_attempts: its own, or its downstream's.
func (c *Config) Attempts(t TenantSettings) int {
	if t.MaxAttempts != nil {
		return *t.MaxAttempts
	}
	return c.Downstreams[t.Downstream].MaxAttempts
}

// maxInFlightLimit bounds a max_in_flight: more attempts at once than a
// process could hold open is a typo.
const maxInFlightLimit = 100_000

// maxWindows bounds a tenant's windows: each is looked at on every
// admission and every send.
const maxWindows = 10

// Built-in bounds of a tenant's scheduled jobs (max_scheduled,
// schedule_horizon) and their limits.
const (
	DefaultMaxScheduled    = 10_000
	maxScheduledLimit      = 1_000_000
	DefaultScheduleHorizon = 30 * 24 * time.Hour
)

// ScheduledCap is the tenant's max_scheduled.
func (t TenantSettings) ScheduledCap() int {
	if t.MaxScheduled == nil {
		return DefaultMaxScheduled
	}
	return *t.MaxScheduled
}

// Horizon is the tenant's schedule_horizon: how far ahead a not_before
// may be.
func (t TenantSettings) Horizon() time.Duration {
	if t.ScheduleHorizon == nil {
		return DefaultScheduleHorizon
	}
	return time.Duration(*t.ScheduleHorizon)
}

// InFlightCap is the tenant's max_in_flight (0: no cap).
func (t TenantSettings) InFlightCap() int {
	if t.MaxInFlight == nil {
		return 0
	}
	return *t.MaxInFlight
}

// Policy is the bucket policy of these settings.
func (t TenantSettings) Policy() leaky.Policy {
	p := leaky.Policy{Interval: t.Rate.Interval(), Burst: *t.Burst, Capacity: *t.Capacity, Windows: t.windows, MaxScheduled: t.ScheduledCap()}
	if t.Mode == ModeToken {
		p.Capacity = 0
	}
	return p
}

// Tenant is the settings of one tenant and whether it may be used at all
// (false: unknown while allow_unknown_tenants is false).
func (c *Config) Tenant(name string) (TenantSettings, bool) {
	if t, ok := c.api.get(name); ok {
		return t, true // a tenant given a policy by the API is known
	}
	if t, ok := c.Tenants[name]; ok {
		return t, true
	}
	allow := c.TenantDefaults.AllowUnknownTenants
	return c.TenantDefaults, allow == nil || *allow // nil: not validated, the default
}

// ValidName reports whether s may name a tenant or downstream: 1 to 128
// ASCII letters, digits or . _ - + @, and not "." or "..".
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 128 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		case b == '.', b == '_', b == '-', b == '+', b == '@':
		default:
			return false
		}
	}
	return true
}

// checkTenantDefaults checks [tenant_defaults], naming the downstream when
// only one is configured.
func (c *Config) checkTenantDefaults() error {
	if err := c.checkPlans(); err != nil {
		return err
	}
	def := &c.TenantDefaults
	c.rawDefaults = *def
	if err := c.takePlan("tenant_defaults", def); err != nil {
		return err
	}
	def.inherit(builtinTenantDefaults())
	if def.AllowUnknownTenants == nil {
		yes := true
		def.AllowUnknownTenants = &yes
	}
	if def.Downstream == "" {
		if len(c.Downstreams) != 1 {
			return c.bad("tenant_defaults.downstream", "name the downstream tenants use (one of %s)", strings.Join(sortedKeys(c.Downstreams), ", "))
		}
		def.Downstream = sortedKeys(c.Downstreams)[0]
	}
	return c.checkTenant("tenant_defaults", def)
}

// checkTenants checks every [tenants.NAME] and fills what each leaves out
// from tenant_defaults.
func (c *Config) checkTenants() error {
	if err := c.checkPlansAlone(); err != nil {
		return err
	}
	c.rawTenants = make(map[string]TenantSettings, len(c.Tenants))
	c.api = newAPIPolicies()
	for _, name := range sortedKeys(c.Tenants) {
		t := c.Tenants[name]
		c.rawTenants[name] = t
		key := "tenants." + name
		if !ValidName(name) {
			return c.bad(key, "tenant name must be 1-128 letters, digits or . _ - + @")
		}
		if t.AllowUnknownTenants != nil {
			return c.bad(key+".allow_unknown_tenants", "belongs in [tenant_defaults] only")
		}
		if err := c.takePlan(key, &t); err != nil {
			return err
		}
		t.inherit(c.TenantDefaults)
		if err := c.checkTenant(key, &t); err != nil {
			return err
		}
		c.Tenants[name] = t
	}
	return nil
}

// checkPlans checks each [plans.NAME]: a name, no key that only
// tenant_defaults has, and no plan of its own. Its values are checked
// where a tenant takes it (checkTenant), and each plan once as
// tenant_defaults would make it (checkPlanAlone).
func (c *Config) checkPlans() error {
	for _, name := range sortedKeys(c.Plans) {
		p := c.Plans[name]
		key := "plans." + name
		switch {
		case !ValidName(name):
			return c.bad(key, "plan name must be 1-128 letters, digits or . _ - + @")
		case p.Plan != "":
			return c.bad(key+".plan", "a plan cannot name another plan: give its keys here")
		case p.AllowUnknownTenants != nil:
			return c.bad(key+".allow_unknown_tenants", "belongs in [tenant_defaults] only")
		}
	}
	return nil
}

// takePlan fills the keys t leaves out from the plan it names (key is
// where t is: "tenant_defaults" or "tenants.NAME").
func (c *Config) takePlan(key string, t *TenantSettings) error {
	if t.Plan == "" {
		return nil
	}
	p, ok := c.Plans[t.Plan]
	if !ok {
		return c.bad(key+".plan", "%q is not a plan (plans: %s)", t.Plan, orNone(sortedKeys(c.Plans)))
	}
	t.inherit(p)
	return nil
}

// checkPlansAlone checks the keys each plan gives, so that a plan no
// tenant names yet is refused for what it says now, not when a tenant
// first takes it. The keys it leaves out are taken as loose as they can
// be (the fastest rate, no capacity), not as tenant_defaults has them: a
// tenant that names the plan may give its own, and the keys a tenant ends
// up with are checked with the tenant (checkTenant).
func (c *Config) checkPlansAlone() error {
	fastest, zero, one := leaky.MustParseRate("1000000/s"), 0, 1
	loosest := TenantSettings{Downstream: c.TenantDefaults.Downstream, Mode: ModeLeaky, Rate: &fastest, Capacity: &zero, Burst: &one}
	for _, name := range sortedKeys(c.Plans) {
		t := TenantSettings{Plan: name}
		if err := c.takePlan("plans."+name, &t); err != nil {
			return err
		}
		t.inherit(loosest)
		if err := c.checkTenant("plans."+name, &t); err != nil {
			return err
		}
	}
	return nil
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none configured"
	}
	return strings.Join(names, ", ")
}

// inherit fills the keys t leaves out from def.
func (t *TenantSettings) inherit(def TenantSettings) {
	t.Downstream = cmp.Or(t.Downstream, def.Downstream)
	t.Mode = cmp.Or(t.Mode, def.Mode)
	t.Rate = cmp.Or(t.Rate, def.Rate)
	t.Capacity = cmp.Or(t.Capacity, def.Capacity)
	t.Burst = cmp.Or(t.Burst, def.Burst)
	t.MaxAttempts = cmp.Or(t.MaxAttempts, def.MaxAttempts)
	t.MaxInFlight = cmp.Or(t.MaxInFlight, def.MaxInFlight)
	t.MaxScheduled = cmp.Or(t.MaxScheduled, def.MaxScheduled)
	t.ScheduleHorizon = cmp.Or(t.ScheduleHorizon, def.ScheduleHorizon)
	t.CallbackURL = cmp.Or(t.CallbackURL, def.CallbackURL)
	if t.Windows == nil {
		t.Windows = def.Windows
	}
}

// checkTenant checks one tenant's settings (key is "tenant_defaults" or
// "tenants.NAME") and parses its windows.
func (c *Config) checkTenant(key string, t *TenantSettings) error {
	bad := func(k, format string, args ...any) error { return c.bad(key+"."+k, format, args...) }
	if _, ok := c.Downstreams[t.Downstream]; !ok {
		return bad("downstream", "%q is not configured (configured: %s)", t.Downstream, strings.Join(sortedKeys(c.Downstreams), ", "))
	}
	if t.Mode != ModeLeaky && t.Mode != ModeToken {
		return bad("mode", "%q is not a mode: use \"leaky\" or \"token\"", t.Mode)
	}
	if t.Rate == nil || t.Rate.IsZero() {
		return bad("rate", "is required, such as \"5/s\"")
	}
	if t.Capacity == nil || *t.Capacity < 0 || *t.Capacity > 10_000_000 {
		return bad("capacity", "must be from 0 to 10000000")
	}
	if t.Burst == nil || *t.Burst < 1 || *t.Burst > 1_000_000 {
		return bad("burst", "must be from 1 to 1000000")
	}
	if err := c.checkCallbackURL(key+".callback_url", t.CallbackURL); err != nil {
		return err
	}
	if t.MaxAttempts != nil && (*t.MaxAttempts < 1 || *t.MaxAttempts > 100) {
		return bad("max_attempts", "must be from 1 to 100, got %d", *t.MaxAttempts)
	}
	if t.MaxInFlight != nil && (*t.MaxInFlight < 0 || *t.MaxInFlight > maxInFlightLimit) {
		return bad("max_in_flight", "must be from 0 (no cap) to %d, got %d", maxInFlightLimit, *t.MaxInFlight)
	}
	if t.MaxScheduled != nil && (*t.MaxScheduled < 1 || *t.MaxScheduled > maxScheduledLimit) {
		return bad("max_scheduled", "must be from 1 to %d, got %d", maxScheduledLimit, *t.MaxScheduled)
	}
	if h := t.ScheduleHorizon; h != nil && (*h <= 0 || time.Duration(*h) > leaky.MaxHorizon) {
		return bad("schedule_horizon", "must be more than 0 and at most %v (10 years), got %v", leaky.MaxHorizon, time.Duration(*h))
	}
	t.windows = nil
	if len(t.Windows) > maxWindows {
		return bad("windows", "at most %d windows, got %d", maxWindows, len(t.Windows))
	}
	for i, text := range t.Windows {
		w, err := leaky.ParseWindow(text)
		if err != nil {
			return bad(fmt.Sprintf("windows[%d]", i), "%v", err)
		}
		if slices.ContainsFunc(t.windows, func(o leaky.Window) bool { return o.String() == w.String() }) {
			return bad(fmt.Sprintf("windows[%d]", i), "window %q is given twice: give each once", text)
		}
		if w.Length <= t.Rate.Interval() {
			return bad(fmt.Sprintf("windows[%d]", i), "window %q is no longer than one interval of the rate %s: it limits nothing the rate does not", text, t.Rate)
		}
		t.windows = append(t.windows, w)
	}
	return c.checkHorizon(key, t.Policy(), t.Rate.String())
}
