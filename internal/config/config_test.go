package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

func writeFile(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNoFileRunsOnDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.Listen != "127.0.0.1:8080" || cfg.Store.Backend != "embedded" {
		t.Fatalf("defaults: %+v", cfg)
	}
	ts, ok := cfg.Tenant("anyone")
	if !ok || ts.Downstream != DefaultDownstream || ts.Policy().Interval != time.Second || ts.Policy().Capacity != 10 {
		t.Fatalf("default tenant: %+v ok=%v", ts, ok)
	}
}

func TestRepositoryConfigLoads(t *testing.T) {
	t.Parallel()
	cfg, err := Load("../../config.toml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	acme, ok := cfg.Tenant("acme")
	if !ok || acme.Policy().Interval != 200*time.Millisecond || acme.Policy().Capacity != 1000 || acme.Mode != ModeLeaky || acme.Downstream != "sms" {
		t.Fatalf("acme: %+v", acme.Policy())
	}
}

func TestNamedTenantInheritsDefaults(t *testing.T) {
	t.Parallel()
	p := writeFile(t, `
[downstreams.a]
url = "http://127.0.0.1:1/"
[tenant_defaults]
mode = "token"
burst = 7
max_in_flight = 4
allow_unknown_tenants = false
[tenants.x]
rate = "2/s"
`)
	cfg, err := Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	x, ok := cfg.Tenant("x")
	if x.InFlightCap() != 4 {
		t.Fatalf("x's max_in_flight %d, want tenant_defaults' 4", x.InFlightCap())
	}
	if !ok || x.Mode != ModeToken || x.Policy().Burst != 7 || x.Policy().Capacity != 0 || x.Policy().Interval != 500*time.Millisecond {
		t.Fatalf("x: %+v %+v", x, x.Policy())
	}
	if _, ok := cfg.Tenant("y"); ok {
		t.Fatal("unknown tenant allowed with allow_unknown_tenants = false")
	}
}

func TestEnvAndFlagsOverrideFile(t *testing.T) {
	t.Parallel()
	p := writeFile(t, "[server]\nlisten = \"127.0.0.1:1111\"\n[tenant_defaults]\ncapacity = 3\n")
	env := []string{"THROTTLER_SERVER_LISTEN=127.0.0.1:2222", "THROTTLER_TENANT_DEFAULTS_RATE=3/s", "THROTTLER_UNRELATED=1", "PATH=/bin"}
	cfg, err := Load(p, env, []string{"tenant_defaults.capacity=42"})
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.TenantDefaults.Policy()
	if cfg.Server.Listen != "127.0.0.1:2222" || d.Capacity != 42 || d.Interval != time.Second/3 {
		t.Fatalf("listen %q policy %+v", cfg.Server.Listen, d)
	}
	// Flags win over env.
	cfg, err = Load(p, env, []string{"server.listen=127.0.0.1:3333"})
	if err != nil || cfg.Server.Listen != "127.0.0.1:3333" {
		t.Fatalf("flag did not win: %v %v", cfg, err)
	}
}

func TestBadConfigNamesFileKeyAndReason(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body, key, reason string
	}{
		{"[server]\nlisten = 8080\n", "server.listen", "line 2"},
		{"[server]\nlisten = \"0.0.0.0:8080\"\n", "server.listen", "loopback"},
		{"[server]\nlistn = \"x\"\n", "server.listn", "unknown key"},
		{"[tenant_defaults]\nrate = \"5/x\"\n", "tenant_defaults.rate", "use s, m, h, d"},
		{"[tenant_defaults]\nmode = \"fast\"\n", "tenant_defaults.mode", "use \"leaky\" or \"token\""},
		{"[tenants.a]\ncapacity = -1\n", "tenants.a.capacity", "from 0"},
		{"[tenants.a]\nburst = 0\n", "tenants.a.burst", "from 1"},
		{"[tenants.a]\ndownstream = \"nope\"\n", "tenants.a.downstream", "not configured"},
		{"[tenants.\"a b\"]\nrate = \"1/s\"\n", "tenants.a b", "tenant name"},
		{"[downstreams.d]\nurl = \"ftp://x\"\n", "downstreams.d.url", "http://"},
		{"[downstreams.a]\nurl = \"http://x\"\n[downstreams.b]\nurl = \"http://y\"\n", "tenant_defaults.downstream", "one of a, b"},
		{"[server]\nshutdown_timeout = \"soon\"\n", "server.shutdown_timeout", "not a duration"},
		{"[store]\nbackend = \"mongo\"\n", "store.backend", "embedded"},
		{"[store]\nbackend = \"redis\"\nredis_url = \"http://x:1\"\n", "store.redis_url", "invalid URL scheme"},
		{"[store]\nbackend = \"redis\"\nredis_mode = \"sentinel\"\nredis_url = \"redis://127.0.0.1:26379\"\n", "store.redis_url", "master_name"},
		{"[store]\nbackend = \"redis\"\nredis_mode = \"replica\"\n", "store.redis_mode", "\"standalone\", \"sentinel\" or \"cluster\""},
		{"[store]\nbackend = \"redis\"\nredis_idle_ttl = \"10ms\"\n", "store.redis_idle_ttl", "at least 1s"},
		{"[tenants.a]\nwindows = [\"1000/d\", \"1.5/h\"]\n", "tenants.a.windows[1]", "whole number"},
		{"[tenants.a]\nrate = \"1/m\"\nwindows = [\"5/s\"]\n", "tenants.a.windows[0]", "no longer than one interval"},
		{"[downstreams.d]\nurl = \"http://x\"\nburst = 3\n", "downstreams.d.burst", "goes with rate"},
		{"[downstreams.d]\nurl = \"http://x\"\nmax_in_flight = -1\n", "downstreams.d.max_in_flight", "from 0 (no cap) to 100000, got -1"},
		{"[downstreams.d]\nurl = \"http://x\"\nrate_limit_headers = \"github\"\n", "downstreams.d.rate_limit_headers", "\"ietf\" (RateLimit fields), \"x-ratelimit\""},
		{"[downstreams.d]\nurl = \"http://x\"\nmax_hold = \"-1s\"\n", "downstreams.d.max_hold", "must be positive"},
		{"[downstreams.d]\nurl = \"http://x\"\nrate_limit_scope = \"account\"\n", "downstreams.d.rate_limit_scope", "\"tenant\" (the tenant whose answer"},
		{"[tenant_defaults]\nmax_in_flight = 1000001\n", "tenant_defaults.max_in_flight", "from 0 (no cap) to 100000"},
		{"[tenants.a]\nmax_in_flight = -3\n", "tenants.a.max_in_flight", "got -3"},
		{"[[auth.tokens]]\nname = \"x\"\n", "auth.tokens.x.sha256", "exactly one of"},
		{"[[auth.tokens]]\nname = \"x\"\nsha256 = \"abc\"\nrole = \"admin\"\ntenants = [\"*\"]\n", "auth.tokens.x.sha256", "64 hex digits"},
		{"[[auth.tokens]]\nname = \"x\"\ntoken_env = \"THROTTLER_TEST_UNSET_TOKEN\"\nrole = \"admin\"\ntenants = [\"*\"]\n", "auth.tokens.x.token_env", "not set"},
		{"[[auth.tokens]]\nname = \"x\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\"\nrole = \"root\"\ntenants = [\"*\"]\n", "auth.tokens.x.role", "admin"},
		{"[[auth.tokens]]\nname = \"x\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\"\nrole = \"viewer\"\n", "auth.tokens.x.tenants", "[\"*\"]"},
		{"[[auth.tokens]]\nname = \"x\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\"\nrole = \"viewer\"\ntenants=[\"*\"]\n[[auth.tokens]]\nname = \"x\"\n", "auth.tokens[1].name", "repeated"},
		{"[server]\nlisten = \"0.0.0.0:8080\"\n", "server.listen", "throttler token new"},
		{"[server]\ntls_cert = \"/nonexistent.pem\"\n", "server.tls_cert", "both"},
		// Horizons past leaky.MaxHorizon.
		{"[tenants.acme]\nrate = \"1/d\"\ncapacity = 200000\n", "tenants.acme", "capacity 200000 at rate 1/d schedules 547 years ahead; at most 10 years (87600h): lower capacity or raise rate"},
		{"[tenant_defaults]\nrate = \"1/d\"\ncapacity = 3651\n", "tenant_defaults", "capacity 3651 at rate 1/d schedules 3651 days ahead; at most 10 years (87600h)"},
		{"[tenants.t]\nmode = \"token\"\nrate = \"1/d\"\nburst = 4000\n", "tenants.t", "burst 4000 at rate 1/d schedules 3999 days ahead; at most 10 years (87600h): lower burst or raise rate"},
		{"[tenants.w]\nrate = \"1000/s\"\ncapacity = 10000000\nwindows = [\"100000/366d\"]\n", "tenants.w", "with windows 100000/366d schedules 101 years ahead; at most 10 years (87600h): lower capacity, raise rate or let each window take more"},
		{"[downstreams.d]\nurl = \"http://x\"\nrate = \"1/d\"\nburst = 1000000\n", "downstreams.d", "burst 1000000 at rate 1/d schedules 2739 years ahead; at most 10 years (87600h): lower burst or raise rate"},
	}
	for _, c := range cases {
		p := writeFile(t, c.body)
		_, err := Load(p, nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) {
			t.Errorf("%q: want *Error, got %v", c.body, err)
			continue
		}
		if cerr.File != p || !strings.Contains(cerr.Key, c.key) || !strings.Contains(cerr.Error(), c.reason) {
			t.Errorf("%q: got file %q key %q: %v; want key %q and %q", c.body, cerr.File, cerr.Key, err, c.key, c.reason)
		}
	}
}

// A horizon of exactly leaky.MaxHorizon loads, and the refusal of one past
// it names the key alone (the tenant: capacity and rate make it together).
func TestHorizonAtTheLimit(t *testing.T) {
	t.Parallel()
	cfg, err := Load(writeFile(t, "[tenants.acme]\nrate = \"1/d\"\ncapacity = 3650\n"), nil, nil)
	if err != nil {
		t.Fatalf("1/d capacity 3650 (ten years): %v", err)
	}
	acme, _ := cfg.Tenant("acme")
	if h := acme.Policy().Horizon(); h != leaky.MaxHorizon {
		t.Fatalf("horizon %v, want %v", h, leaky.MaxHorizon)
	}
	p := writeFile(t, "[tenants.acme]\nrate = \"1/d\"\ncapacity = 200000\n")
	_, err = Load(p, nil, nil)
	want := p + ": tenants.acme: capacity 200000 at rate 1/d schedules 547 years ahead; at most 10 years (87600h): lower capacity or raise rate"
	var cerr *Error
	if !errors.As(err, &cerr) || cerr.Key != "tenants.acme" || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
}

func TestBadOverrides(t *testing.T) {
	t.Parallel()
	for _, o := range []string{"server.listen", "nosuch.key=1", "server.nosuch=1", "dispatch.concurrency=lots", "tenant_defaults.allow_unknown_tenants=maybe"} {
		if _, err := Load("", nil, []string{o}); err == nil {
			t.Errorf("override %q accepted", o)
		}
	}
	if _, err := Load("", []string{"THROTTLER_TENANT_DEFAULTS_CAPACITY=ten"}, nil); err == nil || !strings.Contains(err.Error(), "THROTTLER_TENANT_DEFAULTS_CAPACITY") {
		t.Errorf("bad env: %v", err)
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"acme", "a", "+15551234567", "user@example.com", "A.b_c-d", strings.Repeat("x", 128)} {
		if !ValidName(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", ".", "..", "a b", "a/b", "a:b", "ä", strings.Repeat("x", 129), "a%2Fb", "a\x00"} {
		if ValidName(bad) {
			t.Errorf("%q allowed", bad)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add("[server]\nlisten = \"127.0.0.1:1\"\n")
	f.Add("[tenants.a]\nrate = \"5/s\"\ncapacity = 3\n")
	f.Add("[downstreams.x]\nurl = \"http://127.0.0.1:9/\"\ntimeout = \"1s\"\n")
	f.Add("[tenants.a]\nrate = \"1/d\"\ncapacity = 3650\n")
	f.Add("[downstreams.x]\nurl = \"http://127.0.0.1:9/\"\nrate = \"1/d\"\nburst = 3651\n")
	f.Fuzz(func(t *testing.T, body string) {
		dir := t.TempDir()
		p := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(p, nil, nil)
		if err != nil {
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		// Whatever loads gives a usable policy for every tenant.
		for name := range cfg.Tenants {
			ts, _ := cfg.Tenant(name)
			if err := ts.Policy().Validate(); err != nil {
				t.Fatalf("tenant %s: %v", name, err)
			}
		}
		if err := cfg.TenantDefaults.Policy().Validate(); err != nil {
			t.Fatal(err)
		}
		for name, d := range cfg.Downstreams {
			if c := d.Ceiling(); c != nil {
				if err := c.Validate(); err != nil {
					t.Fatalf("downstream %s: %v", name, err)
				}
			}
		}
	})
}

func TestTokensFromEnvFileAndHash(t *testing.T) {
	t.Setenv("THROTTLER_TEST_TOKEN", "from-env")
	file := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(file, []byte("from-file\n"), 0o600)
	sum := sha256.Sum256([]byte("from-hash"))
	p := writeFile(t, fmt.Sprintf(`
[server]
listen = "0.0.0.0:8080"
[[auth.tokens]]
name = "env"
token_env = "THROTTLER_TEST_TOKEN"
role = "producer"
tenants = ["a", "b"]
[[auth.tokens]]
name = "file"
token_file = %q
role = "viewer"
tenants = ["*"]
[[auth.tokens]]
name = "hash"
sha256 = %q
role = "admin"
tenants = ["*"]
`, file, hex.EncodeToString(sum[:])))
	cfg, err := Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"from-env", "from-file", "from-hash"} {
		if cfg.Auth.Tokens[i].Digest != sha256.Sum256([]byte(want)) {
			t.Errorf("token %d: digest is not of %q", i, want)
		}
	}
	env := cfg.Auth.Tokens[0]
	if !env.Reaches("a") || env.Reaches("c") || env.AllTenants() || !cfg.Auth.Tokens[1].Reaches("c") {
		t.Error("scopes")
	}
	// Beyond loopback without tokens, only when asked for in so many words.
	if _, err := Load("", nil, []string{"server.listen=0.0.0.0:1", "auth.insecure_no_auth=true"}); err != nil {
		t.Fatalf("--insecure-no-auth: %v", err)
	}
}

// Plans: each layer (tenant_defaults, then a tenant's own table) is its
// plan with its own keys over it, and a higher layer overrides a lower one
// wherever it says something; a plan named says all of its keys.
func TestPlansLayer(t *testing.T) {
	t.Parallel()
	p := writeFile(t, `
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
plan = "pro"
capacity = 50
[tenants.plain]
rate = "3/s"
`)
	cfg, err := Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant          string
		interval        time.Duration
		capacity, burst int
		windows, inCap  int
	}{
		{"anyone", time.Second, 100, 2, 0, 0},        // free, and tenant_defaults' own burst
		{"acme", 50 * time.Millisecond, 50, 2, 1, 5}, // pro, with its own capacity
		{"plain", time.Second / 3, 100, 2, 0, 0},     // its own rate over the free default
	} {
		ts, _ := cfg.Tenant(c.tenant)
		pol := ts.Policy()
		if pol.Interval != c.interval || pol.Capacity != c.capacity || pol.Burst != c.burst || len(pol.Windows) != c.windows || ts.InFlightCap() != c.inCap {
			t.Errorf("%s: %+v, max_in_flight %d; want interval %v, capacity %d, burst %d, %d windows, max_in_flight %d",
				c.tenant, pol, ts.InFlightCap(), c.interval, c.capacity, c.burst, c.windows, c.inCap)
		}
	}
	// A plan overrides tenant_defaults' own keys: the tenant's layer is higher.
	p = writeFile(t, "[plans.fast]\nrate = \"50/s\"\n[tenant_defaults]\nrate = \"2/s\"\n[tenants.x]\nplan = \"fast\"\n")
	if cfg, err = Load(p, nil, nil); err != nil {
		t.Fatal(err)
	}
	if x, _ := cfg.Tenant("x"); x.Policy().Interval != 20*time.Millisecond {
		t.Fatalf("x with plan fast over tenant_defaults' 2/s: %v, want 20ms", x.Policy().Interval)
	}
	// The environment names a plan too.
	if cfg, err = Load(p, []string{"THROTTLER_TENANT_DEFAULTS_PLAN=fast"}, nil); err != nil {
		t.Fatal(err)
	}
	if d, _ := cfg.Tenant("someone"); d.Policy().Interval != 500*time.Millisecond {
		t.Fatalf("tenant_defaults' own rate stays over its plan's: %v", d.Policy().Interval)
	}
	// A plan's keys are checked with its own keys, not with
	// tenant_defaults': a window no longer than tenant_defaults' interval
	// is fine in a plan only tenants with a faster rate take.
	p = writeFile(t, "[plans.fast]\nwindows = [\"10/s\"]\n[tenants.x]\nplan = \"fast\"\nrate = \"100/s\"\n")
	if _, err := Load(p, nil, nil); err != nil {
		t.Fatalf("a plan with a 10/s window taken by a 100/s tenant: %v", err)
	}
}

func TestBadPlansNameTheKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, key, reason string }{
		{"[tenants.a]\nplan = \"gold\"\n", "tenants.a.plan", `"gold" is not a plan (plans: none configured)`},
		{"[plans.pro]\nrate = \"2/s\"\n[tenant_defaults]\nplan = \"gold\"\n", "tenant_defaults.plan", "(plans: pro)"},
		{"[plans.pro]\nplan = \"free\"\n", "plans.pro.plan", "cannot name another plan"},
		{"[plans.pro]\nallow_unknown_tenants = false\n", "plans.pro.allow_unknown_tenants", "[tenant_defaults] only"},
		{"[plans.pro]\ncapacity = -1\n", "plans.pro.capacity", "from 0"},
		{"[plans.pro]\nwindows = [\"10/fortnight\"]\n", "plans.pro.windows[0]", ""},
		{"[plans.pro]\nrate = \"-1/s\"\n", "plans.pro.rate", ""},
		{"[plans.\"a b\"]\nrate = \"1/s\"\n", "plans.a b", "plan name"},
	} {
		p := writeFile(t, c.body)
		_, err := Load(p, nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) || !strings.Contains(cerr.Key, c.key) || !strings.Contains(cerr.Error(), c.reason) {
			t.Errorf("%q: %v; want key %q and %q", c.body, err, c.key, c.reason)
		}
	}
}
