package client

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimit is what an enqueue answer's RateLimit fields say
// (draft-ietf-httpapi-ratelimit-headers): the tenant's limits, from
// RateLimit-Policy, and what is left of each, from RateLimit. The zero
// value means the answer had none.
//
// throttler lists the tenant's bucket first, named after its mode ("leaky"
// or "token"): Limit places (capacity waiting + burst at once, or the
// tokens), all free again within Window, one more every interval; then one
// quota per window of the tenant, named as written ("1000/d"): Limit sends
// in any Window, Remaining of them left, Reset until the oldest counted one
// leaves it.
type RateLimit struct {
	Quotas []Quota
}

// Quota is one limit and what is left of it.
type Quota struct {
	Name   string
	Limit  int64         // q: units (jobs) the limit allows in Window
	Window time.Duration // w: 0 if the server did not say
	// Remaining (r) is how many jobs sent now would still find room;
	// HasRemaining is false when RateLimit did not list this quota.
	Remaining    int64
	HasRemaining bool
	// Reset (t) is how long until more room is made (0: none is taken).
	Reset time.Duration
}

// Known reports whether the answer carried the fields.
func (rl RateLimit) Known() bool { return len(rl.Quotas) > 0 }

// Quota finds a quota by name.
func (rl RateLimit) Quota(name string) (Quota, bool) {
	for _, q := range rl.Quotas {
		if q.Name == name {
			return q, true
		}
	}
	return Quota{}, false
}

// Next says how a producer paces itself by these fields: n jobs may go now
// (n >= 1, wait 0), or none until wait has passed (n 0), after which one
// job's answer says how many more. n is -1 when the fields are unknown.
//
// The wait is the longest Reset of the quotas with nothing left, except
// that the first quota (the bucket: its places free one every interval)
// is waited for at most Window/Limit, which is at least an interval: Reset
// is in whole seconds, rounded up, and a queue that drains in under a
// second would otherwise be fed once a second.
func (rl RateLimit) Next() (n int64, wait time.Duration) {
	n = -1
	for i, q := range rl.Quotas {
		if !q.HasRemaining {
			continue
		}
		if n < 0 || q.Remaining < n {
			n = q.Remaining
		}
		if q.Remaining > 0 {
			continue
		}
		w := q.Reset
		if i == 0 && q.Limit > 0 && q.Window > 0 {
			w = min(w, q.Window/time.Duration(q.Limit))
		}
		if w <= 0 {
			w = time.Second // nothing left and no word of when: ask again in a second
		}
		wait = max(wait, w)
	}
	if n > 0 {
		wait = 0
	}
	return n, wait
}

// rateLimitOf reads the fields of an answer; malformed fields count as
// none (a producer then paces by Retry-After alone).
func rateLimitOf(h http.Header) RateLimit {
	rl, err := ParseRateLimit(strings.Join(h.Values("RateLimit-Policy"), ", "), strings.Join(h.Values("RateLimit"), ", "))
	if err != nil {
		return RateLimit{}
	}
	return rl
}

// ParseRateLimit reads the values of a RateLimit-Policy and a RateLimit
// field (Structured Field lists, RFC 8941): items named by a string or a
// token, with integer parameters q, w (policy) and r, t (state); other
// parameters are ignored, as the draft asks.
func ParseRateLimit(policy, state string) (RateLimit, error) {
	var rl RateLimit
	pol, err := parseField("RateLimit-Policy", policy, "q", "quota")
	if err != nil {
		return RateLimit{}, err
	}
	for _, it := range pol {
		rl.Quotas = append(rl.Quotas, Quota{Name: it.name, Limit: it.params["q"], Window: time.Duration(it.params["w"]) * time.Second})
	}
	st, err := parseField("RateLimit", state, "r", "remaining")
	if err != nil {
		return RateLimit{}, err
	}
	for _, it := range st {
		r := it.params["r"]
		i := rl.index(it.name)
		if i < 0 {
			rl.Quotas = append(rl.Quotas, Quota{Name: it.name})
			i = len(rl.Quotas) - 1
		}
		rl.Quotas[i].Remaining, rl.Quotas[i].HasRemaining = r, true
		rl.Quotas[i].Reset = time.Duration(it.params["t"]) * time.Second
	}
	return rl, nil
}

// parseField parses the value of the field name, whose every item must
// have the parameter key (what it means).
func parseField(name, value, key, what string) ([]sfItem, error) {
	items, err := parseList(value)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", name, value, err)
	}
	for _, it := range items {
		if _, ok := it.params[key]; !ok {
			return nil, fmt.Errorf("%s %q: item %q has no %s (%s)", name, value, it.name, what, key)
		}
	}
	return items, nil
}

func (rl RateLimit) index(name string) int {
	for i, q := range rl.Quotas {
		if q.Name == name {
			return i
		}
	}
	return -1
}

// sfItem is one member of a list: its name and its integer parameters.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseList parses a Structured Field list of string or token items with
// parameters, keeping the integer ones (RFC 8941, sections 3.1 and 4.2).
func parseList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	var items []sfItem
	p.skip(" \t")
	for !p.done() {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skip(" \t")
		if p.done() {
			break
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want \",\" between items", p.i)
		}
		p.i++
		p.skip(" \t")
		if p.done() {
			return nil, fmt.Errorf("a \",\" ends the list")
		}
	}
	return items, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skip(chars string) {
	for !p.done() && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	name, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{name: name, params: map[string]int64{}}
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		key := p.key()
		if key == "" {
			return sfItem{}, fmt.Errorf("at %d: want a parameter name", p.i)
		}
		if p.done() || p.s[p.i] != '=' {
			continue // a boolean true: not one of ours
		}
		p.i++
		if !p.done() && (p.s[p.i] == '-' || (p.s[p.i] >= '0' && p.s[p.i] <= '9')) {
			n, err := p.integer()
			if err != nil {
				return sfItem{}, err
			}
			it.params[key] = n
			continue
		}
		if _, err := p.bare(); err != nil { // a string or token parameter: not one of ours
			return sfItem{}, err
		}
	}
	return it, nil
}

// bare reads a string ("...") or a token.
func (p *sfParser) bare() (string, error) {
	if p.done() {
		return "", fmt.Errorf("at %d: want an item", p.i)
	}
	if p.s[p.i] == '"' {
		var b strings.Builder
		for p.i++; !p.done(); p.i++ {
			switch c := p.s[p.i]; {
			case c == '\\' && p.i+1 < len(p.s) && (p.s[p.i+1] == '"' || p.s[p.i+1] == '\\'):
				p.i++
				b.WriteByte(p.s[p.i])
			case c == '"':
				p.i++
				return b.String(), nil
			case c < 0x20 || c > 0x7e || c == '\\':
				return "", fmt.Errorf("at %d: %q in a string", p.i, c)
			default:
				b.WriteByte(c)
			}
		}
		return "", fmt.Errorf("a string is not closed")
	}
	start := p.i
	for !p.done() && isTokenChar(p.s[p.i], p.i == start) {
		p.i++
	}
	if p.i == start {
		return "", fmt.Errorf("at %d: want a string or a token", p.i)
	}
	return p.s[start:p.i], nil
}

func isTokenChar(c byte, first bool) bool {
	alpha := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	if first {
		return alpha || c == '*'
	}
	return alpha || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

func (p *sfParser) key() string {
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		if c >= 'a' && c <= 'z' || c == '*' || (p.i > start && (c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.')) {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i]
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	for !p.done() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		return 0, fmt.Errorf("at %d: want a whole number", p.i)
	}
	n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
	if err != nil || p.i-start > 16 {
		return 0, fmt.Errorf("at %d: %q is not an integer of at most 15 digits", start, p.s[start:p.i])
	}
	return n, nil
}
