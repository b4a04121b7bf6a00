package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sort"
	"time"
)

// Validate checks everything and fills what named tenants leave out. The
// steps run in this order, and the first refusal is the one reported: the
// sections that everything else relies on (where to listen, who may call)
// come first, tenants last since they refer to downstreams.
func (c *Config) Validate() error {
	for _, step := range []func() error{
		c.checkListen,
		c.checkTokens,
		c.checkExposure,
		c.checkTLS,
		c.checkLog,
		c.checkServerLimits,
		c.checkStore,
		c.checkDispatch,
		c.checkDownstreams,
		c.checkCallbacks,
		c.checkTenantDefaults,
		c.checkTenants,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// bad is a refusal of key in c's file.
func (c *Config) bad(key, format string, args ...any) error {
	return &Error{File: c.File, Key: key, Reason: fmt.Sprintf(format, args...)}
}

// listenHost is the host of server.listen.
func (c *Config) listenHost() (string, error) {
	host, _, err := net.SplitHostPort(c.Server.Listen)
	return host, err
}

func (c *Config) checkListen() error {
	if _, err := c.listenHost(); err != nil {
		return c.bad("server.listen", "%q is not host:port: %v", c.Server.Listen, err)
	}
	return nil
}

// checkExposure refuses an API without auth beyond loopback, unless asked
// for in so many words.
func (c *Config) checkExposure() error {
	host, _ := c.listenHost() // checkListen ran first
	if isLoopback(host) || len(c.Auth.Tokens) > 0 || c.Auth.InsecureNoAuth {
		return nil
	}
	return c.bad("server.listen", "%q is not a loopback address and no API tokens are configured: anyone who reaches it could spend your downstream's money. "+
		"Add a token (run `throttler token new --name NAME --role producer --tenants '*'` and paste the [[auth.tokens]] it prints), "+
		"or listen on 127.0.0.1 (or, on a network you fully trust, pass --insecure-no-auth)", c.Server.Listen)
}

func (c *Config) checkTLS() error {
	s := c.Server
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return c.bad("server.tls_cert", "set both tls_cert and tls_key, or neither")
	}
	if s.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(s.TLSCert, s.TLSKey); err != nil {
			return c.bad("server.tls_cert", "cannot load the certificate and key: %v", err)
		}
	}
	return nil
}

func (c *Config) checkLog() error {
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return c.bad("log.level", "%q is not a level: use debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "text", "json":
	default:
		return c.bad("log.format", "%q is not a format: use auto, text or json", c.Log.Format)
	}
	return nil
}

// checkServerLimits checks the bounds of [server]: timeouts, sizes, load.
func (c *Config) checkServerLimits() error {
	s := c.Server
	switch {
	case s.DrainDelay < 0 || s.DrainDelay >= s.ShutdownTimeout:
		return c.bad("server.drain_delay", "must be from 0 to less than shutdown_timeout (%v)", s.ShutdownTimeout.Std())
	case s.MaxConcurrentRequests < 1:
		return c.bad("server.max_concurrent_requests", "must be at least 1, got %d", s.MaxConcurrentRequests)
	case s.MaxRequestsPerClient < 0 || s.MaxRequestsPerClient > s.MaxConcurrentRequests:
		return c.bad("server.max_requests_per_client", "must be from 1 to max_concurrent_requests (%d), or 0 for a quarter of it; got %d", s.MaxConcurrentRequests, s.MaxRequestsPerClient)
	case s.MaxBodyBytes < 1:
		return c.bad("server.max_body_bytes", "must be at least 1, got %d", s.MaxBodyBytes)
	case s.MaxBatchBytes < s.MaxBodyBytes:
		return c.bad("server.max_batch_bytes", "must be at least max_body_bytes (%d), got %d", s.MaxBodyBytes, s.MaxBatchBytes)
	case s.ReadHeaderTimeout <= 0 || s.ShutdownTimeout <= 0:
		return c.bad("server", "read_header_timeout and shutdown_timeout must be positive")
	}
	return nil
}

func (c *Config) checkStore() error {
	switch c.Store.Backend {
	case "embedded":
		if c.Store.Path == "" {
			return c.bad("store.path", "must name a file for the embedded store")
		}
	case "redis":
		if err := c.checkRedis(); err != nil {
			return err
		}
	default:
		return c.bad("store.backend", "%q is not a backend: use \"embedded\" or \"redis\"", c.Store.Backend)
	}
	if c.Store.Reserve < 0 {
		return c.bad("store.reserve", "must not be negative, got %d: write it like \"64MiB\" (\"0\" turns it off)", c.Store.Reserve)
	}
	if c.Store.Retention < Duration(time.Minute) {
		return c.bad("store.retention", "must be at least 1m, got %v", c.Store.Retention.Std())
	}
	return nil
}

// checkRedis checks the redis backend's keys; the URL is parsed, not
// dialled (Redis may start after the config is checked).
func (c *Config) checkRedis() error {
	if !slices.Contains([]string{"standalone", "sentinel", "cluster"}, c.Store.RedisMode) {
		return c.bad("store.redis_mode", "%q is not a mode: use \"standalone\", \"sentinel\" or \"cluster\"", c.Store.RedisMode)
	}
	rc, err := c.Store.redisClient()
	if err != nil {
		return c.bad("store.redis_url", "%v", err)
	}
	rc.Close()
	if c.Store.RedisIdleTTL < Duration(time.Second) {
		return c.bad("store.redis_idle_ttl", "must be at least 1s, got %v", c.Store.RedisIdleTTL.Std())
	}
	if c.Store.RedisPartitions < 1 || c.Store.RedisPartitions > 256 {
		return c.bad("store.redis_partitions", "must be 1 to 256, got %d (every process on one Redis must give the same)", c.Store.RedisPartitions)
	}
	if c.Store.RedisLease < Duration(100*time.Millisecond) {
		return c.bad("store.redis_lease", "must be at least 100ms, got %v", c.Store.RedisLease.Std())
	}
	return nil
}

func (c *Config) checkDispatch() error {
	if c.Dispatch.Concurrency < 1 {
		return c.bad("dispatch.concurrency", "must be at least 1, got %d", c.Dispatch.Concurrency)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sortedKeys are m's keys in order, so that the first refusal of a config
// is the same on every run.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
