package config

import (
	"fmt"
	"net/url"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// Downstream is a named HTTP target, or a Go handler in the program that
// runs throttler (Handler, DESIGN.md section 6d).
type Downstream struct {
	// URL receives a request per attempt (a POST unless Method says
	// otherwise). Exactly one of URL and Handler is required.
	URL string `toml:"url"`
	// Handler names a Go handler registered by the program that runs
	// throttler (the public handler package): each attempt calls it
	// in-process at the job's slot instead of sending a request. A stock
	// `throttler serve` cannot call it: it runs such a config with
	// --role api only.
	Handler string `toml:"handler"`
	// Timeout bounds one attempt: connecting, writing the request and reading
	// the answer. A wait at the gate (the rate, a window, a ceiling) is not
	// part of it: waiting for a turn is never an attempt.
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
	// RateLimitHeaders is how the downstream announces the room it has
	// left in its answers: "ietf" (RateLimit, as the IETF draft has it,
	// any of its forms), "x-ratelimit" (X-RateLimit-Remaining and
	// X-RateLimit-Reset) or "off". When an answer says none is left until
	// a reset, RateLimitScope is held until then, as a 429 with
	// Retry-After holds its tenant, so that no attempt is spent on a
	// refusal. Default "off".
	RateLimitHeaders string `toml:"rate_limit_headers"`
	// RateLimitScope is what an announcement that no room is left holds:
	// "tenant" (the tenant whose answer said so) or "downstream" (every
	// tenant of it: the vendor's limit is the account's). Default
	// "tenant".
	RateLimitScope string `toml:"rate_limit_scope"`
	// MaxHold bounds a hold an announcement asks for: a reset further
	// away is logged and held only this long. Default 1h.
	MaxHold Duration `toml:"max_hold"`
	// MaxInFlight caps the attempts in flight across all tenants of this
	// downstream (the vendor's account-wide limit on open requests),
	// shared fairly by its tenants. 0: no cap. Default 0.
	MaxInFlight int `toml:"max_in_flight"`
	// MaxAttempts is how many failed attempts (5xx, timeouts, connection
	// errors) end a job as failed. Default 5. Pushback (429, 503 with
	// Retry-After) and waits behind an open circuit breaker do not count.
	MaxAttempts int `toml:"max_attempts"`

	// The request a vendor accepts (DESIGN.md section 6a); the checks are
	// in outbound.go, the request is built by internal/outbound.

	// Method is the HTTP method of every attempt: GET, POST, PUT, PATCH or
	// DELETE. Default POST. GET and DELETE send no body.
	Method string `toml:"method"`
	// Body is how the payload becomes the body: "json" (default: the
	// payload as it came), "form" (application/x-www-form-urlencoded from
	// a JSON object) or "raw" (the text of a JSON string).
	Body string `toml:"body"`
	// FormArrays is how a form writes an array of plain values: "repeat"
	// (default: k=a&k=b) or "indexed" (k[0]=a&k[1]=b). Body "form" only.
	FormArrays string `toml:"form_arrays"`
	// ContentType is the raw body's Content-Type. Body "raw" only.
	// Default "text/plain; charset=utf-8".
	ContentType string `toml:"content_type"`
	// Headers are sent on every attempt, after throttler's own (which they
	// may not name, see ProtectedHeader). Default none.
	Headers map[string]string `toml:"headers"`
	// Auth is how the vendor knows us (basic, bearer or a header), its
	// secret read from the environment or a file. Default none.
	Auth DownstreamAuth `toml:"auth"`
	// IdempotencyHeader carries the job id on every attempt. nil means
	// the default "Idempotency-Key"; "" sends none.
	IdempotencyHeader *string `toml:"idempotency_header"`
	// JobPaths are the paths a job may ask for, under the url's
	// scheme://host: an exact path, or a prefix ending in "*". Default
	// none: a job cannot choose the path.
	JobPaths []string `toml:"job_paths"`
	// JobMethods are the methods a job may ask for. Default: only Method.
	JobMethods []string `toml:"job_methods"`
	// JobHeaders are the header names a job may set (any case). Default
	// none.
	JobHeaders []string `toml:"job_headers"`
	// TLSCAFile (PEM) holds the CAs trusted for this downstream instead
	// of the system's. Default none: the system's roots.
	TLSCAFile string `toml:"tls_ca_file"`
	// TLSCertFile and TLSKeyFile (PEM) are a client certificate for
	// mutual TLS; both or neither. Default none.
	TLSCertFile string `toml:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file"`
	// TLSServerName is the name verified (and sent as SNI) when it is not
	// the url's host. Default: the url's host.
	TLSServerName string `toml:"tls_server_name"`
	// SigningSecretEnv or SigningSecretFile names the Standard Webhooks
	// secrets ("whsec_<base64>", space-separated for rotation) that sign
	// every attempt. Default none: not signed.
	SigningSecretEnv  string `toml:"signing_secret_env"`
	SigningSecretFile string `toml:"signing_secret_file"`
	// KeepResponseBytes is how much of each answer's body is kept on the
	// job, in bytes, 0 to 1048576. nil means 4096.
	KeepResponseBytes *int `toml:"keep_response_bytes"`
	// KeepResponseHeaders are kept from each answer beside Content-Type,
	// Location and Retry-After. Default none.
	KeepResponseHeaders []string `toml:"keep_response_headers"`

	// SigningSecret is only here to refuse a secret written in the file.
	SigningSecret InlineSecret `toml:"signing_secret,omitempty"`
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

// checkDownstreams checks every [downstreams.NAME], filling its defaults;
// a config with none gets DefaultDownstream.
func (c *Config) checkDownstreams() error {
	if len(c.Downstreams) == 0 {
		c.Downstreams = map[string]Downstream{DefaultDownstream: {URL: "http://127.0.0.1:9000/send"}}
	}
	for _, name := range sortedKeys(c.Downstreams) {
		d := c.Downstreams[name]
		if err := c.checkDownstream(name, &d); err != nil {
			return err
		}
		c.Downstreams[name] = d
	}
	return nil
}

func (c *Config) checkDownstream(name string, d *Downstream) error {
	key := "downstreams." + name
	if !ValidName(name) {
		return c.bad(key, "name must be 1-128 letters, digits or . _ - + @")
	}
	var u *url.URL
	switch {
	case d.URL != "" && d.Handler != "":
		return c.bad(key, "set exactly one of url (an HTTP downstream) and handler (a Go handler your program registers), not both")
	case d.Handler != "":
		if err := c.checkHandler(key, d); err != nil {
			return err
		}
	case d.URL == "":
		return c.bad(key+".url", "is required: the URL each attempt is sent to (or, for a Go handler your program registers, set handler = \"NAME\" instead)")
	default:
		var err error
		u, err = url.Parse(d.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c.bad(key+".url", "%q must be an http:// or https:// URL", d.URL)
		}
	}
	if d.Timeout == 0 {
		d.Timeout = Duration(5 * time.Second)
	}
	if d.Timeout < 0 {
		return c.bad(key+".timeout", "must be positive")
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = 5
	}
	if d.Handler == "" {
		if err := c.checkAnnounced(key, d); err != nil {
			return err
		}
	}
	if d.MaxInFlight < 0 || d.MaxInFlight > maxInFlightLimit {
		return c.bad(key+".max_in_flight", "must be from 0 (no cap) to %d, got %d", maxInFlightLimit, d.MaxInFlight)
	}
	if d.MaxAttempts < 1 || d.MaxAttempts > 100 {
		return c.bad(key+".max_attempts", "must be from 1 to 100, got %d", d.MaxAttempts)
	}
	if u == nil {
		return c.checkCeiling(key, d) // a handler: checkHandler checked the rest
	}
	if err := c.checkOutbound(key, u, d); err != nil {
		return err
	}
	return c.checkCeiling(key, d)
}

// checkAnnounced checks how an HTTP downstream's announced limits are read
// (rate_limit_headers, rate_limit_scope, max_hold), filling the defaults.
func (c *Config) checkAnnounced(key string, d *Downstream) error {
	switch d.RateLimitHeaders {
	case "":
		d.RateLimitHeaders = "off"
	case "off", "ietf", "x-ratelimit":
	default:
		return c.bad(key+".rate_limit_headers", "%q is not a style: use \"ietf\" (RateLimit fields), \"x-ratelimit\" (X-RateLimit-Remaining and X-RateLimit-Reset) or \"off\"", d.RateLimitHeaders)
	}
	switch d.RateLimitScope {
	case "":
		d.RateLimitScope = "tenant"
	case "tenant", "downstream":
	default:
		return c.bad(key+".rate_limit_scope", "%q is not a scope: use \"tenant\" (the tenant whose answer said no room is left) or \"downstream\" (all its tenants)", d.RateLimitScope)
	}
	if d.MaxHold == 0 {
		d.MaxHold = Duration(time.Hour)
	}
	if d.MaxHold < 0 {
		return c.bad(key+".max_hold", "must be positive")
	}
	return nil
}

// checkCeiling checks the downstream's own limit (rate, burst, windows).
func (c *Config) checkCeiling(key string, d *Downstream) error {
	if d.Burst != nil && d.Rate == nil {
		return c.bad(key+".burst", "goes with rate: set the downstream's rate too, or remove burst")
	}
	if d.Rate != nil && d.Rate.IsZero() {
		return c.bad(key+".rate", "must be a rate such as \"100/s\"")
	}
	if d.Burst != nil && (*d.Burst < 1 || *d.Burst > 1_000_000) {
		return c.bad(key+".burst", "must be from 1 to 1000000")
	}
	d.windows = nil
	for i, text := range d.Windows {
		w, err := leaky.ParseWindow(text)
		if err != nil {
			return c.bad(fmt.Sprintf("%s.windows[%d]", key, i), "%v", err)
		}
		d.windows = append(d.windows, w)
	}
	if p := d.Ceiling(); p != nil {
		rate := ""
		if d.Rate != nil {
			rate = d.Rate.String()
		}
		return c.checkHorizon(key, *p, rate)
	}
	return nil
}
