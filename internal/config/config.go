// Package config loads config.toml: defaults for every key, then the file,
// then THROTTLER_<SECTION>_<KEY> environment variables, then flags. Bad config
// is refused with the file, the key and what to do about it.
package config

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/redis/go-redis/v9"

	"throttler/internal/leaky"
)

// Config is the whole file. Each field's doc gives its default.
type Config struct {
	Server         Server                    `toml:"server"`
	Store          Store                     `toml:"store"`
	Dispatch       Dispatch                  `toml:"dispatch"`
	Downstreams    map[string]Downstream     `toml:"downstreams"`
	TenantDefaults TenantSettings            `toml:"tenant_defaults"`
	Tenants        map[string]TenantSettings `toml:"tenants"`
	Auth           Auth                      `toml:"auth"`
	Log            Log                       `toml:"log"`

	// File is where the config came from ("" for defaults only).
	File string `toml:"-"`
}

// Server is the HTTP API.
type Server struct {
	// Listen is host:port. Default "127.0.0.1:8080". Without auth tokens only
	// loopback addresses are allowed.
	Listen string `toml:"listen"`
	// MaxBodyBytes caps one job's payload, in bytes. Default 1 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxBatchBytes caps the body of a batch request, in bytes. Default 16 MiB.
	MaxBatchBytes int64 `toml:"max_batch_bytes"`
	// ReadHeaderTimeout bounds reading request headers. Default 5s.
	ReadHeaderTimeout Duration `toml:"read_header_timeout"`
	// ShutdownTimeout bounds a clean stop: in-flight HTTP requests and
	// attempts to the downstream. Default 15s.
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
	// DrainDelay is how long a stopping service answers 503 on /readyz
	// before it closes its listener, so that load balancers stop sending
	// first. Default 0s.
	DrainDelay Duration `toml:"drain_delay"`
	// MaxConcurrentRequests caps requests handled at once; past it the API
	// answers 503 at once instead of running out of memory. Default 1024.
	MaxConcurrentRequests int `toml:"max_concurrent_requests"`
	// TLSCert and TLSKey (PEM files) serve the API over HTTPS. Default none.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
}

// Log is how the service logs.
type Log struct {
	// Level is debug, info, warn or error. Default info.
	Level string `toml:"level"`
	// Format is text, json, or auto (text on a terminal, JSON otherwise).
	// Default auto.
	Format string `toml:"format"`
}

// Store is where jobs and bucket state live.
type Store struct {
	// Backend is "embedded" (default) or "redis".
	Backend string `toml:"backend"`
	// Path is the embedded store's file. Default "data/throttler.db".
	Path string `toml:"path"`
	// RedisURL is where the redis backend's Redis is, in go-redis's URL
	// forms: standalone "redis://[user:password@]host:port/db" (rediss://
	// for TLS); Sentinel "redis://[:password@]sentinel:26379?master_name=
	// mymaster&addr=sentinel2:26379"; Cluster "redis://[:password@]
	// host:7000?addr=host2:7001&addr=host3:7002".
	// Default "redis://127.0.0.1:6379/0".
	RedisURL string `toml:"redis_url"`
	// RedisMode is how RedisURL is read: "standalone" (default),
	// "sentinel" or "cluster".
	RedisMode string `toml:"redis_mode"`
	// RedisIdleTTL: a tenant's bucket state in Redis expires this long
	// after its schedule runs out, so tenants that come and go do not
	// fill Redis. Default 10m.
	RedisIdleTTL Duration `toml:"redis_idle_ttl"`
	// Retention is how long finished jobs (and their idempotency keys) are
	// kept. Default 72h.
	Retention Duration `toml:"retention"`
}

// Dispatch is the part that sends jobs to downstreams.
type Dispatch struct {
	// Concurrency caps attempts in progress at once (including those
	// waiting the last moments before their slot). Default 1024.
	Concurrency int `toml:"concurrency"`
}

// Downstream is a named HTTP target.
type Downstream struct {
	// URL receives a POST per attempt. Required.
	URL string `toml:"url"`
	// Timeout bounds one attempt from the moment the request is written.
	// Default 5s.
	Timeout Duration `toml:"timeout"`
	// Rate is a ceiling across all tenants of this downstream (optional):
	// the vendor's account-wide limit, shared fairly between its tenants.
	Rate *leaky.Rate `toml:"rate"`
	// Burst goes with Rate. Default 1.
	Burst *int `toml:"burst"`
	// Windows are the ceiling's limits beside its rate, such as "10000/d".
	Windows []string       `toml:"windows"`
	windows []leaky.Window // parsed when loaded
	// MaxAttempts is how many failed attempts (5xx, timeouts, connection
	// errors) end a job as failed. Default 5. Pushback (429, 503 with
	// Retry-After) and waits behind an open circuit breaker do not count.
	MaxAttempts int `toml:"max_attempts"`
}

// Ceiling is the downstream's limit across its tenants (nil: none).
func (d Downstream) Ceiling() *leaky.Policy {
	if d.Rate == nil && len(d.windows) == 0 {
		return nil
	}
	p := &leaky.Policy{Interval: time.Microsecond, Burst: 1, Windows: d.windows} // windows alone: no rate
	if d.Rate != nil {
		p.Interval = d.Rate.Interval()
	}
	if d.Burst != nil {
		p.Burst = *d.Burst
	}
	return p
}

// Modes of a tenant's bucket.
const (
	ModeLeaky = "leaky"
	ModeToken = "token"
)

// TenantSettings are the settings of one tenant, or the defaults of all.
// A key a named tenant leaves out comes from tenant_defaults.
type TenantSettings struct {
	// Downstream names the target. Default: the only downstream configured.
	Downstream string `toml:"downstream"`
	// Mode is "leaky" (default) or "token".
	Mode string `toml:"mode"`
	// Rate is N/DURATION. Default "1/s".
	Rate *leaky.Rate `toml:"rate"`
	// Capacity is how many jobs may wait (leaky mode). Default 10.
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
	// AllowUnknownTenants (tenant_defaults only): false refuses tenants not
	// named in [tenants.*] with 404. Default true.
	AllowUnknownTenants *bool `toml:"allow_unknown_tenants"`
}

// Auth holds API tokens. With none, the API has no auth and listens on
// loopback addresses only.
type Auth struct {
	Tokens []Token `toml:"tokens"`
	// InsecureNoAuth allows listening beyond loopback with no tokens (for a
	// network you fully trust). Default false; also the flag
	// --insecure-no-auth.
	InsecureNoAuth bool `toml:"insecure_no_auth"`
}

// Roles of a token.
const (
	RoleAdmin    = "admin"    // everything
	RoleProducer = "producer" // enqueue, read and cancel its tenants' jobs
	RoleViewer   = "viewer"   // read status
)

// Token is one API token. The token itself is never in the file: its
// SHA-256 is (sha256), or it is read from an environment variable
// (token_env) or a file (token_file) when the config loads.
type Token struct {
	Name      string   `toml:"name"`
	SHA256    string   `toml:"sha256"`
	TokenEnv  string   `toml:"token_env"`
	TokenFile string   `toml:"token_file"`
	Role      string   `toml:"role"`
	Tenants   []string `toml:"tenants"`

	// Digest is the SHA-256 of the token, filled by Validate.
	Digest [32]byte `toml:"-"`
}

// AllTenants reports whether the token reaches every tenant.
func (t Token) AllTenants() bool { return slices.Contains(t.Tenants, "*") }

// Reaches reports whether the token's scope includes tenant.
func (t Token) Reaches(tenant string) bool {
	return t.AllTenants() || slices.Contains(t.Tenants, tenant)
}

// Duration is a time.Duration written as "5s" in the file.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration: write it like \"5s\", \"250ms\" or \"1h30m\"", b)
	}
	*d = Duration(v)
	return nil
}

// Std is d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Error is a refused config: which file, which key, and why.
type Error struct {
	File   string
	Key    string
	Reason string
}

func (e *Error) Error() string {
	file := e.File
	if file == "" {
		file = "config"
	}
	if e.Key == "" {
		return file + ": " + e.Reason
	}
	return file + ": " + e.Key + ": " + e.Reason
}

// DefaultDownstream is the downstream a config without any gets, so that
// `throttler serve` runs with no file at all.
const DefaultDownstream = "default"

// Default is the config with no file: everything has a value.
func Default() *Config {
	one, ten, yes := 1, 10, true
	rate := leaky.MustParseRate("1/s")
	return &Config{
		Server: Server{
			Listen:                "127.0.0.1:8080",
			MaxBodyBytes:          1 << 20,
			MaxBatchBytes:         16 << 20,
			ReadHeaderTimeout:     Duration(5 * time.Second),
			ShutdownTimeout:       Duration(15 * time.Second),
			MaxConcurrentRequests: 1024,
		},
		Store: Store{
			Backend:      "embedded",
			Path:         "data/throttler.db",
			RedisURL:     "redis://127.0.0.1:6379/0",
			RedisMode:    "standalone",
			RedisIdleTTL: Duration(10 * time.Minute),
			Retention:    Duration(72 * time.Hour),
		},
		Dispatch: Dispatch{Concurrency: 1024},
		Log:      Log{Level: "info", Format: "auto"},
		TenantDefaults: TenantSettings{
			Mode:                ModeLeaky,
			Rate:                &rate,
			Capacity:            &ten,
			Burst:               &one,
			AllowUnknownTenants: &yes,
		},
	}
}

// Load reads file (none if "") over the defaults, then applies env (as
// os.Environ gives it) and the overrides ("section.key=value", from flags),
// and validates the result.
func Load(file string, env []string, overrides []string) (*Config, error) {
	cfg := Default()
	if file != "" {
		cfg.File = file
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, &Error{File: file, Reason: fmt.Sprintf("cannot read: %v", err)}
		}
		if err := cfg.decode(string(raw)); err != nil {
			return nil, err
		}
	}
	if err := cfg.applyEnv(env); err != nil {
		return nil, err
	}
	for _, o := range overrides {
		key, value, ok := strings.Cut(o, "=")
		if !ok {
			return nil, &Error{File: "flag --set", Key: o, Reason: "want section.key=value, e.g. --set server.listen=127.0.0.1:9090"}
		}
		if err := cfg.set(strings.TrimSpace(key), value); err != nil {
			return nil, &Error{File: "flag --set", Key: key, Reason: err.Error()}
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *Config) decode(raw string) error {
	// Named tenants and downstreams start empty: keys they leave out are
	// filled from the defaults after decoding.
	md, err := toml.Decode(raw, c)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return &Error{File: c.File, Key: perr.LastKey, Reason: fmt.Sprintf("line %d: %s", perr.Position.Line, perr.Message)}
		}
		// Type mismatches are plain errors that name the key only in their
		// text: `toml: line 2 (last key "server.listen"): incompatible types...`.
		msg := strings.TrimPrefix(err.Error(), "toml: ")
		if m := lastKeyRE.FindStringSubmatch(msg); m != nil {
			return &Error{File: c.File, Key: m[2], Reason: strings.TrimSpace(m[1] + strings.TrimPrefix(msg, m[0]))}
		}
		return &Error{File: c.File, Reason: msg}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return &Error{File: c.File, Key: keys[0], Reason: fmt.Sprintf("unknown key (unknown: %s); see config.toml in the repository for every key", strings.Join(keys, ", "))}
	}
	return nil
}

var lastKeyRE = regexp.MustCompile(`^(line \d+ )?\(last key "([^"]*)"\):`)

// envSections are the sections that THROTTLER_<SECTION>_<KEY> reaches.
func (c *Config) envSections() map[string]reflect.Value {
	return map[string]reflect.Value{
		"server":          reflect.ValueOf(&c.Server).Elem(),
		"store":           reflect.ValueOf(&c.Store).Elem(),
		"dispatch":        reflect.ValueOf(&c.Dispatch).Elem(),
		"tenant_defaults": reflect.ValueOf(&c.TenantDefaults).Elem(),
		"auth":            reflect.ValueOf(&c.Auth).Elem(),
		"log":             reflect.ValueOf(&c.Log).Elem(),
	}
}

func (c *Config) applyEnv(env []string) error {
	known := map[string]string{}
	for section, v := range c.envSections() {
		for i := 0; i < v.NumField(); i++ {
			key := v.Type().Field(i).Tag.Get("toml")
			known["THROTTLER_"+strings.ToUpper(section+"_"+key)] = section + "." + key
		}
	}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "THROTTLER_") || name == "THROTTLER_TOKEN" || name == "THROTTLER_CONFIG" {
			continue
		}
		path, ok := known[name]
		if !ok {
			continue // other programs' THROTTLER_ variables are not ours to refuse
		}
		if err := c.set(path, value); err != nil {
			return &Error{File: "environment " + name, Key: path, Reason: err.Error()}
		}
	}
	return nil
}

// set assigns one "section.key" from text, as env and flags give it.
func (c *Config) set(path, value string) error {
	section, key, ok := strings.Cut(path, ".")
	sv, known := c.envSections()[section]
	if !ok || !known {
		return fmt.Errorf("unknown key; settable sections are server, store, dispatch, tenant_defaults, auth and log")
	}
	for i := 0; i < sv.NumField(); i++ {
		if sv.Type().Field(i).Tag.Get("toml") == key {
			return setText(sv.Field(i), value)
		}
	}
	return fmt.Errorf("unknown key in [%s]", section)
}

func setText(f reflect.Value, value string) error {
	if f.Kind() == reflect.Pointer {
		p := reflect.New(f.Type().Elem())
		if err := setText(p.Elem(), value); err != nil {
			return err
		}
		f.Set(p)
		return nil
	}
	if u, ok := f.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
		return u.UnmarshalText([]byte(value))
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(value)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a whole number", value)
		}
		f.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return fmt.Errorf("%q is not true or false", value)
		}
		f.SetBool(b)
	default:
		return fmt.Errorf("this key cannot be set from the environment or a flag; set it in the file")
	}
	return nil
}

// Validate checks everything and fills what named tenants leave out.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &Error{File: c.File, Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	s := c.Server
	host, _, err := net.SplitHostPort(s.Listen)
	if err != nil {
		return bad("server.listen", "%q is not host:port: %v", s.Listen, err)
	}
	if err := c.checkTokens(); err != nil {
		return err
	}
	if !isLoopback(host) && len(c.Auth.Tokens) == 0 && !c.Auth.InsecureNoAuth {
		return bad("server.listen", "%q is not a loopback address and no API tokens are configured: anyone who reaches it could spend your downstream's money. "+
			"Add a token (run `throttler token new --name NAME --role producer --tenants '*'` and paste the [[auth.tokens]] it prints), "+
			"or listen on 127.0.0.1 (or, on a network you fully trust, pass --insecure-no-auth)", s.Listen)
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return bad("server.tls_cert", "set both tls_cert and tls_key, or neither")
	}
	if s.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(s.TLSCert, s.TLSKey); err != nil {
			return bad("server.tls_cert", "cannot load the certificate and key: %v", err)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return bad("log.level", "%q is not a level: use debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "text", "json":
	default:
		return bad("log.format", "%q is not a format: use auto, text or json", c.Log.Format)
	}
	if s.DrainDelay < 0 || s.DrainDelay >= s.ShutdownTimeout {
		return bad("server.drain_delay", "must be from 0 to less than shutdown_timeout (%v)", s.ShutdownTimeout.Std())
	}
	if s.MaxConcurrentRequests < 1 {
		return bad("server.max_concurrent_requests", "must be at least 1, got %d", s.MaxConcurrentRequests)
	}
	if s.MaxBodyBytes < 1 {
		return bad("server.max_body_bytes", "must be at least 1, got %d", s.MaxBodyBytes)
	}
	if s.MaxBatchBytes < s.MaxBodyBytes {
		return bad("server.max_batch_bytes", "must be at least max_body_bytes (%d), got %d", s.MaxBodyBytes, s.MaxBatchBytes)
	}
	if s.ReadHeaderTimeout <= 0 || s.ShutdownTimeout <= 0 {
		return bad("server", "read_header_timeout and shutdown_timeout must be positive")
	}
	switch c.Store.Backend {
	case "embedded":
		if c.Store.Path == "" {
			return bad("store.path", "must name a file for the embedded store")
		}
	case "redis":
		if !slices.Contains([]string{"standalone", "sentinel", "cluster"}, c.Store.RedisMode) {
			return bad("store.redis_mode", "%q is not a mode: use \"standalone\", \"sentinel\" or \"cluster\"", c.Store.RedisMode)
		}
		rc, err := c.Store.redisClient()
		if err != nil {
			return bad("store.redis_url", "%v", err)
		}
		rc.Close()
		if c.Store.RedisIdleTTL < Duration(time.Second) {
			return bad("store.redis_idle_ttl", "must be at least 1s, got %v", c.Store.RedisIdleTTL.Std())
		}
	default:
		return bad("store.backend", "%q is not a backend: use \"embedded\" or \"redis\"", c.Store.Backend)
	}
	if c.Store.Retention < Duration(time.Minute) {
		return bad("store.retention", "must be at least 1m, got %v", c.Store.Retention.Std())
	}
	if c.Dispatch.Concurrency < 1 {
		return bad("dispatch.concurrency", "must be at least 1, got %d", c.Dispatch.Concurrency)
	}
	if len(c.Downstreams) == 0 {
		c.Downstreams = map[string]Downstream{DefaultDownstream: {URL: "http://127.0.0.1:9000/send"}}
	}
	for _, name := range sortedKeys(c.Downstreams) {
		d := c.Downstreams[name]
		key := "downstreams." + name
		if !ValidName(name) {
			return bad(key, "name must be 1-128 letters, digits or . _ - + @")
		}
		u, err := url.Parse(d.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad(key+".url", "%q must be an http:// or https:// URL", d.URL)
		}
		if d.Timeout == 0 {
			d.Timeout = Duration(5 * time.Second)
		}
		if d.Timeout < 0 {
			return bad(key+".timeout", "must be positive")
		}
		if d.MaxAttempts == 0 {
			d.MaxAttempts = 5
		}
		if d.MaxAttempts < 1 || d.MaxAttempts > 100 {
			return bad(key+".max_attempts", "must be from 1 to 100, got %d", d.MaxAttempts)
		}
		if d.Burst != nil && d.Rate == nil {
			return bad(key+".burst", "goes with rate: set the downstream's rate too, or remove burst")
		}
		if d.Rate != nil && d.Rate.IsZero() {
			return bad(key+".rate", "must be a rate such as \"100/s\"")
		}
		if d.Burst != nil && (*d.Burst < 1 || *d.Burst > 1_000_000) {
			return bad(key+".burst", "must be from 1 to 1000000")
		}
		d.windows = nil
		for i, text := range d.Windows {
			w, err := leaky.ParseWindow(text)
			if err != nil {
				return bad(fmt.Sprintf("%s.windows[%d]", key, i), "%v", err)
			}
			d.windows = append(d.windows, w)
		}
		c.Downstreams[name] = d
	}
	def := &c.TenantDefaults
	if def.Downstream == "" {
		if len(c.Downstreams) != 1 {
			return bad("tenant_defaults.downstream", "name the downstream tenants use (one of %s)", strings.Join(sortedKeys(c.Downstreams), ", "))
		}
		def.Downstream = sortedKeys(c.Downstreams)[0]
	}
	if err := c.checkTenant("tenant_defaults", def); err != nil {
		return err
	}
	for _, name := range sortedKeys(c.Tenants) {
		t := c.Tenants[name]
		key := "tenants." + name
		if !ValidName(name) {
			return bad(key, "tenant name must be 1-128 letters, digits or . _ - + @")
		}
		if t.AllowUnknownTenants != nil {
			return bad(key+".allow_unknown_tenants", "belongs in [tenant_defaults] only")
		}
		t.Downstream = cmp.Or(t.Downstream, def.Downstream)
		t.Mode = cmp.Or(t.Mode, def.Mode)
		t.Rate = cmp.Or(t.Rate, def.Rate)
		t.Capacity = cmp.Or(t.Capacity, def.Capacity)
		t.Burst = cmp.Or(t.Burst, def.Burst)
		t.MaxAttempts = cmp.Or(t.MaxAttempts, def.MaxAttempts)
		if t.Windows == nil {
			t.Windows = def.Windows
		}
		if err := c.checkTenant(key, &t); err != nil {
			return err
		}
		c.Tenants[name] = t
	}
	return nil
}

func (c *Config) checkTenant(key string, t *TenantSettings) error {
	bad := func(k, format string, args ...any) error {
		return &Error{File: c.File, Key: key + "." + k, Reason: fmt.Sprintf(format, args...)}
	}
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
	if t.MaxAttempts != nil && (*t.MaxAttempts < 1 || *t.MaxAttempts > 100) {
		return bad("max_attempts", "must be from 1 to 100, got %d", *t.MaxAttempts)
	}
	t.windows = nil
	for i, text := range t.Windows {
		w, err := leaky.ParseWindow(text)
		if err != nil {
			return bad(fmt.Sprintf("windows[%d]", i), "%v", err)
		}
		if w.Length <= t.Rate.Interval() {
			return bad(fmt.Sprintf("windows[%d]", i), "window %q is no longer than one interval of the rate %s: it limits nothing the rate does not", text, t.Rate)
		}
		t.windows = append(t.windows, w)
	}
	return nil
}

// checkTokens validates [[auth.tokens]] and computes each token's digest.
func (c *Config) checkTokens() error {
	seen := map[string]bool{}
	for i := range c.Auth.Tokens {
		t := &c.Auth.Tokens[i]
		key := fmt.Sprintf("auth.tokens[%d]", i)
		bad := func(k, format string, args ...any) error {
			return &Error{File: c.File, Key: key + "." + k, Reason: fmt.Sprintf(format, args...)}
		}
		if t.Name == "" || seen[t.Name] {
			return bad("name", "every token needs a name of its own (for logs); %q is empty or repeated", t.Name)
		}
		seen[t.Name] = true
		key = "auth.tokens." + t.Name
		sources := 0
		for _, v := range []string{t.SHA256, t.TokenEnv, t.TokenFile} {
			if v != "" {
				sources++
			}
		}
		if sources != 1 {
			return bad("sha256", "give exactly one of sha256 (the hex SHA-256 of the token: `throttler token new` prints it), token_env or token_file")
		}
		switch {
		case t.SHA256 != "":
			raw, err := hex.DecodeString(strings.TrimSpace(t.SHA256))
			if err != nil || len(raw) != 32 {
				return bad("sha256", "must be 64 hex digits (the SHA-256 of the token, not the token)")
			}
			copy(t.Digest[:], raw)
		case t.TokenEnv != "":
			v := strings.TrimSpace(os.Getenv(t.TokenEnv))
			if v == "" {
				return bad("token_env", "environment variable %s is not set or empty", t.TokenEnv)
			}
			t.Digest = sha256.Sum256([]byte(v))
		default:
			raw, err := os.ReadFile(t.TokenFile)
			if err != nil {
				return bad("token_file", "cannot read: %v", err)
			}
			v := strings.TrimSpace(string(raw))
			if v == "" {
				return bad("token_file", "%s is empty", t.TokenFile)
			}
			t.Digest = sha256.Sum256([]byte(v))
		}
		if t.Role != RoleAdmin && t.Role != RoleProducer && t.Role != RoleViewer {
			return bad("role", "%q is not a role: use \"admin\", \"producer\" or \"viewer\"", t.Role)
		}
		if len(t.Tenants) == 0 {
			return bad("tenants", "name the tenants it may reach, or [\"*\"] for all")
		}
		for _, name := range t.Tenants {
			if name != "*" && !ValidName(name) {
				return bad("tenants", "%q is not a tenant name", name)
			}
		}
	}
	return nil
}

// NeedsRestart lists the keys whose change between c and next a running
// service cannot take: everything but tenants, tenant defaults and
// downstreams.
func (c *Config) NeedsRestart(next *Config) []string {
	var keys []string
	for _, f := range []struct {
		key  string
		a, b any
	}{
		{"server", c.Server, next.Server},
		{"store", c.Store, next.Store},
		{"dispatch", c.Dispatch, next.Dispatch},
		{"auth", c.Auth, next.Auth},
		{"log", c.Log, next.Log},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			keys = append(keys, f.key)
		}
	}
	return keys
}

// Policy is the bucket policy of these settings.
// Attempts is the tenant's max_attempts: its own, or its downstream's.
func (c *Config) Attempts(t TenantSettings) int {
	if t.MaxAttempts != nil {
		return *t.MaxAttempts
	}
	return c.Downstreams[t.Downstream].MaxAttempts
}

func (t TenantSettings) Policy() leaky.Policy {
	p := leaky.Policy{Interval: t.Rate.Interval(), Burst: *t.Burst, Capacity: *t.Capacity, Windows: t.windows}
	if t.Mode == ModeToken {
		p.Capacity = 0
	}
	return p
}

// Tenant is the settings of one tenant and whether it may be used at all
// (false: unknown while allow_unknown_tenants is false).
func (c *Config) Tenant(name string) (TenantSettings, bool) {
	if t, ok := c.Tenants[name]; ok {
		return t, true
	}
	return c.TenantDefaults, *c.TenantDefaults.AllowUnknownTenants
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

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// RedisClient is a client for the redis backend's Redis, as configured.
// It does not connect yet.
func (s Store) RedisClient() (redis.UniversalClient, error) {
	c, err := s.redisClient()
	if err != nil {
		return nil, fmt.Errorf("store.redis_url: %w", err)
	}
	return c, nil
}

// redisPoolSize is the connection pool's size unless the URL sets
// pool_size: workers hold many jobs at once, and go-redis's default (10 per
// CPU) would make their claims wait for a connection.
const redisPoolSize = 128

// noRetries turns off go-redis's own retries, whatever the URL says: it
// replays a command whose answer was lost (a timeout, a dropped
// connection) even if Redis ran it, and a script replayed would decide
// twice (admit a job twice, take a second grant). The store retries what is
// safe to retry itself.
const noRetries = -1

func (s Store) redisClient() (redis.UniversalClient, error) {
	switch s.RedisMode {
	case "", "standalone":
		o, err := redis.ParseURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		o.PoolSize, o.MaxRetries = cmp.Or(o.PoolSize, redisPoolSize), noRetries
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("a Sentinel URL needs ?master_name=NAME")
		}
		o.PoolSize, o.MaxRetries = cmp.Or(o.PoolSize, redisPoolSize), noRetries
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(s.RedisURL)
		if err != nil {
			return nil, err
		}
		o.PoolSize, o.MaxRetries = cmp.Or(o.PoolSize, redisPoolSize), noRetries
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("store.redis_mode %q is not a mode: use \"standalone\", \"sentinel\" or \"cluster\"", s.RedisMode)
}
