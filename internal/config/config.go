// Package config owns throttler's configuration: the one struct that
// config.toml decodes into, the defaults of every key, the order in which the
// file, THROTTLER_<SECTION>_<KEY> environment variables and flags override
// each other, and validation. Bad config is refused with the file, the key
// and what to do about it.
//
// Files by topic: config.go (the sections and their defaults), load.go
// (file, environment, flags), validate.go (the checks, in order),
// downstream.go, outbound.go (a downstream's request, auth and signing),
// handler.go (downstreams that are Go handlers), tenant.go, horizon.go,
// callbacks.go, auth.go and redis.go. The configuration reference (docs) is
// checked against these types (reference_test.go).
package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// Config is the whole file. Each field's doc gives its default.
type Config struct {
	Server         Server                    `toml:"server"`
	Store          Store                     `toml:"store"`
	Dispatch       Dispatch                  `toml:"dispatch"`
	Downstreams    map[string]Downstream     `toml:"downstreams"`
	TenantDefaults TenantSettings            `toml:"tenant_defaults"`
	Tenants        map[string]TenantSettings `toml:"tenants"`
	// Plans name sets of tenant settings that tenant_defaults and
	// [tenants.NAME] may take by name (plan = "pro"): a layer is its
	// plan with its own keys over it (DESIGN.md 6f).
	Plans     map[string]TenantSettings `toml:"plans"`
	Auth      Auth                      `toml:"auth"`
	Log       Log                       `toml:"log"`
	Callbacks Callbacks                 `toml:"callbacks"`

	// File is where the config came from ("" for defaults only).
	File string `toml:"-"`

	// rawDefaults and rawTenants are tenant_defaults and [tenants.X] as the
	// file says them (before plans and defaults fill them): where a key
	// comes from (PolicyOf).
	rawDefaults TenantSettings
	rawTenants  map[string]TenantSettings
	// api is the API's layer of tenants' policies (policy.go).
	api *apiPolicies
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
	// MaxRequestsPerClient caps the requests one client (a token, or an
	// address without one) has open at once, so that no one client takes
	// every slot. Default 0: a quarter of MaxConcurrentRequests.
	MaxRequestsPerClient int `toml:"max_requests_per_client"`
	// TLSCert and TLSKey (PEM files) serve the API over HTTPS. Default none.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
}

// RequestsPerClient is MaxRequestsPerClient, or its default.
func (s Server) RequestsPerClient() int {
	if s.MaxRequestsPerClient > 0 {
		return s.MaxRequestsPerClient
	}
	return max(s.MaxConcurrentRequests/4, 1)
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
	// RedisPartitions is P, how many partitions the tenants hash onto,
	// each owned by one worker at a time: fixed per Redis (the first
	// process records it, and a process configured otherwise is refused).
	// 1 to 256. Default 32.
	RedisPartitions int `toml:"redis_partitions"`
	// RedisLease is a partition's lease: a worker that dies holding
	// partitions has them taken over about this long after its last
	// renewal. Default 5s; at least 100ms.
	RedisLease Duration `toml:"redis_lease"`
	// Retention is how long finished jobs (and their idempotency keys) are
	// kept. Default 72h.
	Retention Duration `toml:"retention"`
	// Reserve (embedded) is the room kept on the store's filesystem for
	// deliveries' outcomes, cancels and the maintainer: while less is free
	// (counting the pages the store's file has free for reuse), new jobs
	// are refused with 507 store_full and come back by themselves once
	// there is room (DESIGN.md 6c). Bytes, or "64MiB", "512KiB", "1GiB".
	// Default 64MiB; "0" turns it off (a write that fails for room is
	// still answered 507).
	Reserve Bytes `toml:"reserve"`
}

// Dispatch is the part that sends jobs to downstreams.
type Dispatch struct {
	// Concurrency caps attempts in progress at once (including those
	// waiting the last moments before their slot). Default 1024.
	Concurrency int `toml:"concurrency"`
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

// Bytes is a size written as a number of bytes or as "64MiB" in the file
// (B, KiB, MiB, GiB, TiB; KB, MB, GB, TB are powers of 1000).
type Bytes int64

func (b Bytes) MarshalText() ([]byte, error) { return []byte(strconv.FormatInt(int64(b), 10)), nil }

func (b *Bytes) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	num := strings.TrimRightFunc(s, unicode.IsLetter)
	units := map[string]float64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
	unit, ok := units[strings.TrimSpace(s[len(num):])]
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || v < 0 || v*unit > 1<<62 {
		return fmt.Errorf("%q is not a size: write it like \"64MiB\", \"512KiB\" or a number of bytes", text)
	}
	*b = Bytes(v * unit)
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

// Default is the config with no file: everything has a value once
// validated (tenant_defaults' are filled then, under its plan's).
func Default() *Config {
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
			Backend:         "embedded",
			Path:            "data/throttler.db",
			RedisURL:        "redis://127.0.0.1:6379/0",
			RedisMode:       "standalone",
			RedisIdleTTL:    Duration(10 * time.Minute),
			RedisPartitions: 32,
			RedisLease:      Duration(5 * time.Second),
			Retention:       Duration(72 * time.Hour),
			Reserve:         64 << 20,
		},
		Dispatch: Dispatch{Concurrency: 1024},
		Log:      Log{Level: "info", Format: "auto"},
	}
}

// builtinTenantDefaults are the tenant settings that neither
// tenant_defaults nor its plan gives.
func builtinTenantDefaults() TenantSettings {
	one, ten, yes, scheduled, horizon := 1, 10, true, DefaultMaxScheduled, Duration(DefaultScheduleHorizon)
	rate := leaky.MustParseRate("1/s")
	return TenantSettings{Mode: ModeLeaky, Rate: &rate, Capacity: &ten, Burst: &one, AllowUnknownTenants: &yes,
		MaxScheduled: &scheduled, ScheduleHorizon: &horizon}
}

// NeedsRestart lists the keys whose change between c and next a running
// service cannot take: everything but tenants, tenant defaults,
// downstreams and callbacks.
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
