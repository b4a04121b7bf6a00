package config

import (
	"net/url"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/secret"
)

// Callbacks is [callbacks]: how a job's end is told to its producer
// (DESIGN.md section 6b). Absent (no signing secret named): no job may ask
// for a callback.
type Callbacks struct {
	// SigningSecretEnv or SigningSecretFile names the Standard Webhooks
	// secrets ("whsec_<base64>", space-separated for rotation) every
	// callback is signed with. Required once the section is used.
	SigningSecretEnv  string `toml:"signing_secret_env"`
	SigningSecretFile string `toml:"signing_secret_file"`
	// Allow are the URL prefixes a callback may go to (a job's
	// callback_url, a tenant's): each an absolute http or https URL.
	// Default none, so [callbacks] must name at least one.
	Allow []string `toml:"allow"`
	// Timeout bounds one attempt. Default 5s.
	Timeout Duration `toml:"timeout"`
	// MaxAttempts is how many attempts a callback gets before it is given
	// up (its state "failed"). Default 20.
	MaxAttempts int `toml:"max_attempts"`
	// MinBackoff and MaxBackoff bound the wait before the next attempt:
	// full jitter, a random wait up to MinBackoff doubled per attempt,
	// capped at MaxBackoff. Defaults 1s and 6h (20 attempts then span up
	// to about a day and a half, about 17 hours on average).
	MinBackoff Duration `toml:"min_backoff"`
	MaxBackoff Duration `toml:"max_backoff"`
	// Concurrency caps callbacks in flight at once in one process.
	// Default 16.
	Concurrency int `toml:"concurrency"`

	// SigningSecret is only here to refuse a secret written in the file.
	SigningSecret InlineSecret `toml:"signing_secret,omitempty"`
}

// Defaults of [callbacks].
const (
	CallbackTimeoutDefault     = 5 * time.Second
	CallbackMaxAttemptsDefault = 20
	CallbackMinBackoffDefault  = time.Second
	CallbackMaxBackoffDefault  = 6 * time.Hour
	CallbackConcurrencyDefault = 16
)

// Enabled reports whether callbacks are configured.
func (c Callbacks) Enabled() bool { return c.SigningSecretEnv != "" || c.SigningSecretFile != "" }

// SigningRef is where the callbacks' signing secrets come from.
func (c Callbacks) SigningRef() secret.Ref {
	return secret.Ref{Env: c.SigningSecretEnv, File: c.SigningSecretFile}
}

// Allowed reports whether a callback may go to u: it starts with one of
// the allow-list's prefixes.
func (c Callbacks) Allowed(u string) bool {
	for _, p := range c.Allow {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

// checkCallbacks checks [callbacks], filling its defaults.
func (c *Config) checkCallbacks() error {
	cb := &c.Callbacks
	if cb.SigningSecret {
		return c.inline("callbacks.signing_secret")
	}
	used := cb.Enabled() || len(cb.Allow) > 0
	if err := c.secretPair("callbacks.signing_secret", cb.SigningRef(), used, "callbacks are signed (Standard Webhooks)"); err != nil {
		return err
	}
	if used && len(cb.Allow) == 0 {
		return c.bad("callbacks.allow", "name the URL prefixes callbacks may go to, such as [\"https://app.example.com/hooks/\"]")
	}
	for _, p := range cb.Allow {
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c.bad("callbacks.allow", "%q is not an http or https URL prefix such as \"https://app.example.com/hooks/\"", p)
		}
		// A prefix that stops inside the host ("https://app.example.com")
		// would allow https://app.example.com.evil.example too.
		if rest := p[len(u.Scheme)+3:]; !strings.Contains(rest, "/") {
			return c.bad("callbacks.allow", "%q must end its host with a path (add \"/\"): as it is it would allow %q", p, p+".other.example/")
		}
	}
	if cb.Timeout == 0 {
		cb.Timeout = Duration(CallbackTimeoutDefault)
	}
	if cb.MaxAttempts == 0 {
		cb.MaxAttempts = CallbackMaxAttemptsDefault
	}
	if cb.MinBackoff == 0 {
		cb.MinBackoff = Duration(CallbackMinBackoffDefault)
	}
	if cb.MaxBackoff == 0 {
		cb.MaxBackoff = Duration(CallbackMaxBackoffDefault)
	}
	if cb.Concurrency == 0 {
		cb.Concurrency = CallbackConcurrencyDefault
	}
	switch {
	case cb.Timeout < 0 || cb.MinBackoff < 0 || cb.MaxBackoff < 0:
		return c.bad("callbacks", "timeout, min_backoff and max_backoff must be positive durations")
	case cb.MaxBackoff < cb.MinBackoff:
		return c.bad("callbacks.max_backoff", "%v is less than min_backoff (%v)", cb.MaxBackoff.Std(), cb.MinBackoff.Std())
	case cb.MaxAttempts < 1 || cb.MaxAttempts > 1000:
		return c.bad("callbacks.max_attempts", "must be 1 to 1000, got %d", cb.MaxAttempts)
	case cb.Concurrency < 1 || cb.Concurrency > 10000:
		return c.bad("callbacks.concurrency", "must be 1 to 10000, got %d", cb.Concurrency)
	}
	return nil
}

// checkCallbackURL checks a tenant's callback_url against [callbacks].
func (c *Config) checkCallbackURL(key, u string) error {
	if u == "" {
		return nil
	}
	if !c.Callbacks.Enabled() {
		return c.bad(key, "callbacks are not configured: add a [callbacks] section with signing_secret_env and allow")
	}
	if !c.Callbacks.Allowed(u) {
		// The URL itself is not repeated: its query may carry a token.
		return c.bad(key, "%s does not start with any of callbacks.allow %q", RedactURL(u), c.Callbacks.Allow)
	}
	return nil
}

// RedactURL is a URL as it may be shown to anyone: its scheme, host and
// path, without user info, query or fragment (where tokens ride), "…"
// marking what was cut; "" stays "". Not a URL at all: "(a URL that does
// not parse)".
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse)"
	}
	cut := u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery
	u.User, u.RawQuery, u.Fragment, u.ForceQuery = nil, "", "", false
	if cut {
		return u.String() + "…"
	}
	return u.String()
}
