package config

import (
	"fmt"
	"slices"
	"strings"
)

// A downstream that is a Go handler (DESIGN.md section 6d): its attempts
// call a function the program registered by name, so the keys that shape
// an HTTP request (section 6a) have nothing to shape and are refused,
// naming the key, rather than silently ignored. What a handler keeps:
// timeout, rate, burst, windows, max_attempts (pacing and retries, as for
// any downstream), keep_response_bytes (how much of what it returns is
// kept), and job_methods, job_paths and job_headers (what a job's
// "request" may carry to the handler).

// handlerOnlyHTTP are the keys a handler downstream refuses, each with
// whether the downstream sets it.
func handlerOnlyHTTP(d *Downstream) []struct {
	key string
	set bool
} {
	return []struct {
		key string
		set bool
	}{
		{"method", d.Method != ""},
		{"body", d.Body != ""},
		{"form_arrays", d.FormArrays != ""},
		{"content_type", d.ContentType != ""},
		{"headers", len(d.Headers) > 0},
		{"auth", d.Auth != (DownstreamAuth{})},
		{"idempotency_header", d.IdempotencyHeader != nil},
		{"tls_ca_file", d.TLSCAFile != ""},
		{"tls_cert_file", d.TLSCertFile != ""},
		{"tls_key_file", d.TLSKeyFile != ""},
		{"tls_server_name", d.TLSServerName != ""},
		{"signing_secret_env", d.SigningSecretEnv != ""},
		{"signing_secret_file", d.SigningSecretFile != ""},
		{"signing_secret", bool(d.SigningSecret)},
		{"keep_response_headers", len(d.KeepResponseHeaders) > 0},
		{"rate_limit_headers", d.RateLimitHeaders != "" && d.RateLimitHeaders != "off"},
		{"rate_limit_scope", d.RateLimitScope != ""},
		{"max_hold", d.MaxHold != 0},
	}
}

// checkHandler checks a handler downstream's name and refuses the keys
// that only an HTTP request has. Method stays empty: a handler has no
// method of its own, so a job's request may name only job_methods'.
func (c *Config) checkHandler(key string, d *Downstream) error {
	if !ValidName(d.Handler) {
		return c.bad(key+".handler", "%q is not a handler name: 1-128 letters, digits or . _ - + @ (the name your program registers it under)", d.Handler)
	}
	for _, k := range handlerOnlyHTTP(d) {
		if k.set {
			return c.bad(key+"."+k.key, "shapes an HTTP request, and %s calls the Go handler %q instead: remove it (the handler does its own %s)", key, d.Handler, handlerDoes(k.key))
		}
	}
	if err := c.checkJobLists(key, nil, d); err != nil {
		return err
	}
	if n := d.KeepBytes(); n < 0 || n > MaxKeepResponseBytes {
		return c.bad(key+".keep_response_bytes", "must be from 0 to %d (bytes), got %d", MaxKeepResponseBytes, n)
	}
	return nil
}

// handlerDoes says what a handler does in place of an HTTP-only key.
func handlerDoes(key string) string {
	switch {
	case key == "auth" || strings.HasPrefix(key, "tls_"):
		return "authentication with the vendor"
	case strings.HasPrefix(key, "signing_secret"):
		return "signing, if its vendor wants any"
	case key == "keep_response_headers":
		return "answer: the bytes it returns are kept, up to keep_response_bytes"
	case key == "rate_limit_headers" || key == "rate_limit_scope" || key == "max_hold":
		return "pushback: a handler that knows its vendor has no room left returns a pushback error with the wait"
	}
	return "encoding of the payload"
}

// Handlers lists the Go handlers the config's downstreams name, each with
// the first key that names it ("downstreams.NAME.handler"), sorted.
func (c *Config) Handlers() [][2]string {
	var out [][2]string
	for _, name := range sortedKeys(c.Downstreams) {
		if h := c.Downstreams[name].Handler; h != "" && !slices.ContainsFunc(out, func(p [2]string) bool { return p[0] == h }) {
			out = append(out, [2]string{h, fmt.Sprintf("downstreams.%s.handler", name)})
		}
	}
	return out
}
