package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// PolicyLayer is a tenant's policy as the API sets it (PUT
// /v1/tenants/{t}/policy): a plan and/or keys, the highest of a tenant's
// three layers (tenant_defaults, the file's [tenants.X], this one). A key
// left out (null) is the layers' below; a plan named here says all of its
// keys (DESIGN.md 6f).
type PolicyLayer struct {
	Plan        string      `json:"plan,omitempty"`
	Downstream  string      `json:"downstream,omitempty"`
	Mode        string      `json:"mode,omitempty"`
	Rate        *leaky.Rate `json:"rate,omitempty"`
	Capacity    *int        `json:"capacity,omitempty"`
	Burst       *int        `json:"burst,omitempty"`
	Windows     []string    `json:"windows"` // null: the layers' below; []: none
	MaxAttempts *int        `json:"max_attempts,omitempty"`
	MaxInFlight *int        `json:"max_in_flight,omitempty"`
	// MaxScheduled and ScheduleHorizon: TenantSettings'.
	MaxScheduled    *int      `json:"max_scheduled,omitempty"`
	ScheduleHorizon *Duration `json:"schedule_horizon,omitempty"`
	CallbackURL     string    `json:"callback_url,omitempty"`
}

// policyKey is where a refusal of the API's layer points: "policy.rate".
const policyKey = "policy"

// ParsePolicyLayer reads a layer as the API takes it: one JSON object of
// known keys. The error names the key.
func ParsePolicyLayer(raw []byte) (PolicyLayer, error) {
	var l PolicyLayer
	var fields map[string]json.RawMessage
	// json.Unmarshal, not a Decoder: it refuses anything after the object.
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return l, &Error{Key: policyKey, Reason: "want one JSON object of policy keys, such as {\"plan\": \"pro\"} or {\"rate\": \"20/s\"}"}
	}
	targets := map[string]any{"plan": &l.Plan, "downstream": &l.Downstream, "mode": &l.Mode, "rate": &l.Rate,
		"capacity": &l.Capacity, "burst": &l.Burst, "windows": &l.Windows, "max_attempts": &l.MaxAttempts,
		"max_in_flight": &l.MaxInFlight, "max_scheduled": &l.MaxScheduled, "schedule_horizon": &l.ScheduleHorizon,
		"callback_url": &l.CallbackURL}
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		target, ok := targets[key]
		if !ok {
			return l, &Error{Key: policyKey + "." + key, Reason: fmt.Sprintf("is not a policy key (keys: %s)", strings.Join(slices.Sorted(maps.Keys(targets)), ", "))}
		}
		if err := json.Unmarshal(fields[key], target); err != nil {
			var typeErr *json.UnmarshalTypeError
			if errors.As(err, &typeErr) {
				return l, &Error{Key: policyKey + "." + key, Reason: fmt.Sprintf("want a %s, got a JSON %s", typeErr.Type, typeErr.Value)}
			}
			return l, &Error{Key: policyKey + "." + key, Reason: err.Error()}
		}
	}
	return l, nil
}

// IsEmpty reports a layer that says nothing.
func (l PolicyLayer) IsEmpty() bool {
	return l.settings().says() == nil && l.Plan == ""
}

// Keys are the keys the layer says, its plan first.
func (l PolicyLayer) Keys() []string {
	keys := l.settings().says()
	if l.Plan != "" {
		keys = append([]string{"plan"}, keys...)
	}
	return keys
}

func (l PolicyLayer) settings() TenantSettings {
	return TenantSettings{Plan: l.Plan, Downstream: l.Downstream, Mode: l.Mode, Rate: l.Rate, Capacity: l.Capacity,
		Burst: l.Burst, Windows: l.Windows, MaxAttempts: l.MaxAttempts, MaxInFlight: l.MaxInFlight,
		MaxScheduled: l.MaxScheduled, ScheduleHorizon: l.ScheduleHorizon, CallbackURL: l.CallbackURL}
}

// policyFields are the keys a layer can say, each with whether t says it.
var policyFields = []struct {
	name string
	says func(t TenantSettings) bool
}{
	{"downstream", func(t TenantSettings) bool { return t.Downstream != "" }},
	{"mode", func(t TenantSettings) bool { return t.Mode != "" }},
	{"rate", func(t TenantSettings) bool { return t.Rate != nil }},
	{"capacity", func(t TenantSettings) bool { return t.Capacity != nil }},
	{"burst", func(t TenantSettings) bool { return t.Burst != nil }},
	{"windows", func(t TenantSettings) bool { return t.Windows != nil }},
	{"max_attempts", func(t TenantSettings) bool { return t.MaxAttempts != nil }},
	{"max_in_flight", func(t TenantSettings) bool { return t.MaxInFlight != nil }},
	{"max_scheduled", func(t TenantSettings) bool { return t.MaxScheduled != nil }},
	{"schedule_horizon", func(t TenantSettings) bool { return t.ScheduleHorizon != nil }},
	{"callback_url", func(t TenantSettings) bool { return t.CallbackURL != "" }},
}

// says lists the keys t gives itself.
func (t TenantSettings) says() []string {
	var keys []string
	for _, f := range policyFields {
		if f.says(t) {
			keys = append(keys, f.name)
		}
	}
	return keys
}

// Where a tenant's key comes from (PolicyOf).
const (
	FromAPI     = "api"     // the API's layer says it
	FromPlan    = "plan"    // the plan the API's layer or the file's [tenants.X] names
	FromFile    = "file"    // the file's [tenants.X]
	FromDefault = "default" // tenant_defaults (its own keys, its plan's, or built in)
)

// Policy is a tenant's effective policy, the layers it comes from, and the
// API's layer.
type Policy struct {
	Settings TenantSettings
	// Plan is the plan of the highest layer that names one ("" none), and
	// PlanFrom that layer (FromAPI, FromFile, FromDefault).
	Plan, PlanFrom string
	// From says, by key (policyFields' names), where its value comes from.
	From map[string]string
	// API is the API's layer (false: none).
	API    PolicyLayer
	HasAPI bool
}

// PolicyOf is tenant's policy and where each key comes from.
func (c *Config) PolicyOf(tenant string) Policy {
	ts, _ := c.Tenant(tenant)
	p := Policy{Settings: ts, From: map[string]string{}}
	p.API, p.HasAPI = c.api.layer(tenant)
	file, named := c.rawTenants[tenant]
	layers := []struct {
		own  TenantSettings
		from string
		on   bool
	}{{p.API.settings(), FromAPI, p.HasAPI}, {file, FromFile, named}, {c.rawDefaults, FromDefault, true}}
	for _, l := range layers {
		if l.on && p.Plan == "" && l.own.Plan != "" {
			p.Plan, p.PlanFrom = l.own.Plan, l.from
		}
	}
	for _, f := range policyFields {
		p.From[f.name] = FromDefault
	fields:
		for _, l := range layers[:2] {
			switch {
			case !l.on:
			case f.says(l.own):
				p.From[f.name] = l.from
				break fields
			case l.own.Plan != "" && f.says(c.Plans[l.own.Plan]):
				p.From[f.name] = FromPlan
				break fields
			}
		}
	}
	return p
}

// layered is tenant's settings with layer over the file's: the layer's own
// keys, then its plan's, then what the file gives the tenant. Refusals
// name "policy.KEY".
func (c *Config) layered(tenant string, layer PolicyLayer) (TenantSettings, error) {
	t := layer.settings()
	if err := c.takePlan(policyKey, &t); err != nil {
		return t, err
	}
	t.inherit(c.fileTenant(tenant))
	if err := c.checkTenant(policyKey, &t); err != nil {
		return t, err
	}
	return t, nil
}

// fileTenant is tenant's settings as the file gives them.
func (c *Config) fileTenant(tenant string) TenantSettings {
	if t, ok := c.Tenants[tenant]; ok {
		return t
	}
	return c.TenantDefaults
}

// SetPolicy checks layer as tenant's API layer and, if it holds, puts it
// in force in c; it returns the tenant's settings. Nothing changes on a
// refusal (an *Error naming "policy.KEY"). Callers that keep the layer
// (in the store) do so before SetPolicy, so that what is in force was kept.
func (c *Config) SetPolicy(tenant string, layer PolicyLayer) (TenantSettings, error) {
	if !ValidName(tenant) {
		return TenantSettings{}, &Error{Key: "tenant", Reason: fmt.Sprintf("%q is not a tenant name: 1 to 128 ASCII letters, digits or . _ - + @", tenant)}
	}
	if layer.IsEmpty() {
		return TenantSettings{}, &Error{Key: policyKey, Reason: "says nothing: give a plan or a key (to go back to the file's policy, DELETE it)"}
	}
	t, err := c.layered(tenant, layer)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.File = "" // the API's layer is not the file's
		}
		return t, err
	}
	c.api.set(tenant, layer, t)
	return t, nil
}

// CheckPolicy is SetPolicy's check alone: it puts nothing in force.
func (c *Config) CheckPolicy(tenant string, layer PolicyLayer) error {
	probe := *c
	probe.api = nil
	_, err := probe.SetPolicy(tenant, layer)
	return err
}

// KnownByFile reports whether the file lets tenant be used whatever the
// API sets: it names it, or allow_unknown_tenants lets it in.
func (c *Config) KnownByFile(tenant string) bool {
	if _, ok := c.Tenants[tenant]; ok {
		return true
	}
	allow := c.TenantDefaults.AllowUnknownTenants
	return allow == nil || *allow
}

// DropPolicy takes tenant's API layer out of force (false: it had none).
func (c *Config) DropPolicy(tenant string) bool { return c.api.drop(tenant) }

// AdoptPolicies puts every API layer of from in force in c (a reloaded
// file takes the running layers). A layer the new file refuses (a plan it
// no longer has) refuses the whole adoption, naming the tenant and key.
func (c *Config) AdoptPolicies(from *Config) error {
	layers := from.api.all()
	for _, tenant := range slices.Sorted(maps.Keys(layers)) {
		if _, err := c.SetPolicy(tenant, layers[tenant]); err != nil {
			return fmt.Errorf("tenant %q's policy, set by the API: %w; change the file or the policy (throttler tenant set|reset %s)", tenant, err, tenant)
		}
	}
	return nil
}

// PolicyLayers is every API layer in force, by tenant.
func (c *Config) PolicyLayers() map[string]PolicyLayer { return c.api.all() }

// apiPolicies are the API layers in force and the settings each makes.
// One is made per config (at validation) and shared by its copies; a nil
// one has none.
type apiPolicies struct {
	mu       sync.RWMutex
	layers   map[string]PolicyLayer
	resolved map[string]TenantSettings
}

func newAPIPolicies() *apiPolicies {
	return &apiPolicies{layers: map[string]PolicyLayer{}, resolved: map[string]TenantSettings{}}
}

func (a *apiPolicies) get(tenant string) (TenantSettings, bool) {
	if a == nil {
		return TenantSettings{}, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	t, ok := a.resolved[tenant]
	return t, ok
}

func (a *apiPolicies) layer(tenant string) (PolicyLayer, bool) {
	if a == nil {
		return PolicyLayer{}, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	l, ok := a.layers[tenant]
	return l, ok
}

func (a *apiPolicies) set(tenant string, l PolicyLayer, t TenantSettings) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.layers[tenant], a.resolved[tenant] = l, t
}

func (a *apiPolicies) drop(tenant string) bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, had := a.layers[tenant]
	delete(a.layers, tenant)
	delete(a.resolved, tenant)
	return had
}

func (a *apiPolicies) all() map[string]PolicyLayer {
	if a == nil {
		return nil
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	return maps.Clone(a.layers)
}
