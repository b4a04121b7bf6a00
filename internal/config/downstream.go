package config

import (
	"fmt"
	"net/url"
	"time"

	"throttler/internal/leaky"
)

// Downstream is a named HTTP target.
type Downstream struct {
	// URL receives a POST per attempt. Required.
	URL string `toml:"url"`
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
	u, err := url.Parse(d.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c.bad(key+".url", "%q must be an http:// or https:// URL", d.URL)
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
	if d.MaxAttempts < 1 || d.MaxAttempts > 100 {
		return c.bad(key+".max_attempts", "must be from 1 to 100, got %d", d.MaxAttempts)
	}
	return c.checkCeiling(key, d)
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
