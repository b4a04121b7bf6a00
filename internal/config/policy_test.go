package config

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const plansFile = `
[plans.free]
rate = "1/s"
capacity = 100
[plans.pro]
rate = "20/s"
capacity = 10000
windows = ["100000/d"]
max_in_flight = 5
[tenant_defaults]
plan = "free"
burst = 2
[tenants.acme]
capacity = 7
[tenants.beta]
plan = "pro"
`

// summary is what a test reads of a tenant's policy.
func summary(c *Config, tenant string) string {
	p := c.PolicyOf(tenant)
	ts := p.Settings
	return fmt.Sprintf("%s cap %d burst %d windows %v inflight %d plan %q from %s | rate:%s capacity:%s burst:%s windows:%s",
		ts.Rate, *ts.Capacity, *ts.Burst, ts.Windows, ts.InFlightCap(), p.Plan, p.PlanFrom,
		p.From["rate"], p.From["capacity"], p.From["burst"], p.From["windows"])
}

// The API's layer is over the file's as DESIGN.md 6f says: a plan named
// there says all of its keys (so {"plan": "pro"} is pro whatever the file
// gave), a key given there says itself, the rest is the file's; each key
// says where it comes from; dropping the layer gives the file's back.
func TestPolicyLayersOverTheFile(t *testing.T) {
	t.Parallel()
	cfg, err := Load(writeFile(t, plansFile), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(s string) PolicyLayer {
		l, err := ParsePolicyLayer([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return l
	}
	fileAcme := summary(cfg, "acme")
	if want := `1/s cap 7 burst 2 windows [] inflight 0 plan "free" from default | rate:default capacity:file burst:default windows:default`; fileAcme != want {
		t.Errorf("acme by the file:\n got %s\nwant %s", fileAcme, want)
	}
	for _, c := range []struct{ tenant, layer, want string }{
		{"acme", `{"plan":"pro"}`, `20/s cap 10000 burst 2 windows [100000/d] inflight 5 plan "pro" from api | rate:plan capacity:plan burst:default windows:plan`},
		{"acme", `{"plan":"pro","capacity":50}`, `20/s cap 50 burst 2 windows [100000/d] inflight 5 plan "pro" from api | rate:plan capacity:api burst:default windows:plan`},
		{"acme", `{"rate":"5/s","windows":[]}`, `5/s cap 7 burst 2 windows [] inflight 0 plan "free" from default | rate:api capacity:file burst:default windows:api`},
		{"beta", `{"burst":3}`, `20/s cap 10000 burst 3 windows [100000/d] inflight 5 plan "pro" from file | rate:plan capacity:plan burst:api windows:plan`},
		{"newco", `{"plan":"pro","rate":"2/s"}`, `2/s cap 10000 burst 2 windows [100000/d] inflight 5 plan "pro" from api | rate:api capacity:plan burst:default windows:plan`},
	} {
		if _, err := cfg.SetPolicy(c.tenant, parse(c.layer)); err != nil {
			t.Fatalf("%s %s: %v", c.tenant, c.layer, err)
		}
		if got := summary(cfg, c.tenant); got != c.want {
			t.Errorf("%s %s:\n got %s\nwant %s", c.tenant, c.layer, got, c.want)
		}
	}
	if _, known := cfg.Tenant("newco"); !known {
		t.Error("a tenant given a policy is not known")
	}
	if !cfg.DropPolicy("acme") || cfg.DropPolicy("acme") {
		t.Error("DropPolicy: want true, then false")
	}
	if got := summary(cfg, "acme"); got != fileAcme {
		t.Errorf("acme after the drop: %s; want the file's %s", got, fileAcme)
	}
}

// A policy that does not hold is refused naming its key, and the tenant's
// policy in force is unchanged; a reloaded file that no longer has a plan a
// policy names is refused naming the tenant.
func TestBadPoliciesNameTheKey(t *testing.T) {
	t.Parallel()
	cfg, err := Load(writeFile(t, plansFile), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := ParsePolicyLayer([]byte(`{"plan":"pro"}`))
	if _, err := cfg.SetPolicy("acme", l); err != nil {
		t.Fatal(err)
	}
	before := summary(cfg, "acme")
	for _, c := range []struct{ body, key, says string }{
		{`{"plan":"gold"}`, "policy.plan", `"gold" is not a plan (plans: free, pro)`},
		{`{"rate":"-1/s"}`, "policy.rate", "-1/s"},
		{`{"rate":5}`, "policy.rate", "want a"},
		{`{"windows":["5/fortnight"]}`, "policy.windows[0]", "fortnight"},
		{`{"windows":["100/h","100/h"]}`, "policy.windows[1]", "given twice"},
		{`{"windows":["1/h","2/h","3/h","4/h","5/h","6/h","7/h","8/h","9/h","10/h","11/h"]}`, "policy.windows", "at most 10"},
		{`{"capacity":-1}`, "policy.capacity", "from 0 to 10000000"},
		{`{"max_in_flight":-2}`, "policy.max_in_flight", "from 0"},
		{`{"downstream":"nowhere"}`, "policy.downstream", `"nowhere" is not configured`},
		{`{"ratee":"5/s"}`, "policy.ratee", "not a policy key"},
		{`{}`, "policy", "says nothing"},
		{`[1]`, "policy", "one JSON object"},
		{`{"plan":"pro"} {}`, "policy", "one JSON object"},
	} {
		l, err := ParsePolicyLayer([]byte(c.body))
		if err == nil {
			_, err = cfg.SetPolicy("acme", l)
		}
		var e *Error
		if !errors.As(err, &e) || e.Key != c.key || !strings.Contains(e.Reason, c.says) {
			t.Errorf("%s: %v; want a refusal of %s saying %q", c.body, err, c.key, c.says)
		}
		if got := summary(cfg, "acme"); got != before {
			t.Errorf("%s changed the policy in force: %s", c.body, got)
		}
	}
	// A reload without the plan a policy names.
	noPro := strings.NewReplacer("[plans.pro]", "[plans.team]", "[tenants.beta]\nplan = \"pro\"", "").Replace(plansFile)
	next, err := Load(writeFile(t, noPro), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = next.AdoptPolicies(cfg)
	if err == nil || !strings.Contains(err.Error(), `tenant "acme"`) || !strings.Contains(err.Error(), "policy.plan") {
		t.Errorf("a reload without plan pro: %v; want a refusal naming acme and policy.plan", err)
	}
	same, err := Load(writeFile(t, plansFile+"\n[tenants.gamma]\nrate = \"2/s\"\n"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := same.AdoptPolicies(cfg); err != nil {
		t.Fatal(err)
	}
	if got := summary(same, "acme"); got != before {
		t.Errorf("after a reload: %s; want %s", got, before)
	}
}

// Every key of a tenant's settings is a key of the API's layer (all but
// those a layer cannot say): a key added to TenantSettings and not to
// PolicyLayer is found here.
func TestPolicyLayerHasEveryTenantKey(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[TenantSettings]()
	for i := range typ.NumField() {
		key := typ.Field(i).Tag.Get("toml")
		if key == "" || key == "plan" || key == "allow_unknown_tenants" {
			continue
		}
		if !slices.ContainsFunc(policyFields, func(f struct {
			name string
			says func(t TenantSettings) bool
		}) bool {
			return f.name == key
		}) {
			t.Errorf("%s: not in policyFields", key)
		}
		if _, err := ParsePolicyLayer([]byte(`{"` + key + `":null}`)); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
}

// BenchmarkPolicyHeap measures the live heap a tenant's policy set by the
// API costs (b.N tenants each given {"plan": "pro", "capacity": N}), after
// a collection: go test -run '^$' -bench PolicyHeap -benchtime 100000x ./internal/config
func BenchmarkPolicyHeap(b *testing.B) {
	cfg, err := Load(writeFile(b, plansFile), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range b.N {
		capacity := 50 + i%1000
		if _, err := cfg.SetPolicy(fmt.Sprint("tenant-", i), PolicyLayer{Plan: "pro", Capacity: &capacity}); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "heap-B/policy")
	runtime.KeepAlive(cfg)
}
