package dispatch

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The styles of rate limit fields a downstream may announce its room in
// (config's rate_limit_headers).
const (
	AnnounceOff   = "off"
	AnnounceIETF  = "ietf"        // draft-ietf-httpapi-ratelimit-headers
	AnnounceXRate = "x-ratelimit" // X-RateLimit-Remaining and X-RateLimit-Reset
)

// exhausted reads an answer's rate limit fields in style and reports
// whether they say no room is left, and for how long: the wait until the
// reset (0 when it is now or past). False when they say there is room,
// or say nothing that can be read: a field this does not understand
// changes nothing.
//
// IETF, every form of the draft: "RateLimit" as a list of quotas, each
// with r (remaining) and t (seconds until the reset), `"default";r=0;t=30`
// (drafts 08 on); "RateLimit" as one dictionary, `limit=10, remaining=0,
// reset=30` (drafts 04-07); "RateLimit-Remaining" and "RateLimit-Reset"
// (drafts 00-03). Any quota with nothing left counts, the longest reset
// of them wins.
//
// x-ratelimit: "X-RateLimit-Remaining" and either "X-RateLimit-Reset-After"
// (seconds, fractions allowed) or "X-RateLimit-Reset": seconds until the
// reset, or the reset itself in Unix seconds (GitHub, Shopify's REST
// Admin API; a value past 10^9 is read as one).
func exhausted(h http.Header, style string, now time.Time) (time.Duration, bool) {
	switch style {
	case AnnounceIETF:
		if v := h.Values("RateLimit"); len(v) > 0 {
			return ietfExhausted(strings.Join(v, ","))
		}
		return fieldsExhausted(h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset"), "", now)
	case AnnounceXRate:
		return fieldsExhausted(h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"), h.Get("X-RateLimit-Reset-After"), now)
	}
	return 0, false
}

// ietfExhausted reads a "RateLimit" field of the draft's list form (each
// member a quota with parameters r and t) or its older dictionary form
// (remaining=, reset=).
func ietfExhausted(field string) (time.Duration, bool) {
	var wait time.Duration
	found := false
	dict := map[string]string{}
	for _, member := range splitOutsideQuotes(field, ',') {
		parts := splitOutsideQuotes(member, ';')
		if len(parts) == 0 {
			continue
		}
		if k, v, ok := strings.Cut(strings.TrimSpace(parts[0]), "="); ok && len(parts) == 1 {
			dict[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			continue
		}
		params := map[string]string{}
		for _, p := range parts[1:] {
			if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok {
				params[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		r, rok := wholeNumber(params["r"])
		t, tok := seconds(params["t"])
		if rok && tok && r == 0 {
			wait, found = max(wait, t), true
		}
	}
	if found {
		return wait, true
	}
	if len(dict) > 0 {
		r, rok := wholeNumber(dict["remaining"])
		t, tok := seconds(dict["reset"])
		if rok && tok && r == 0 {
			return t, true
		}
	}
	return 0, false
}

// fieldsExhausted reads a remaining count and a reset given as separate
// fields: resetAfter in seconds, else reset in seconds or Unix seconds.
func fieldsExhausted(remaining, reset, resetAfter string, now time.Time) (time.Duration, bool) {
	r, ok := wholeNumber(strings.TrimSpace(remaining))
	if !ok || r != 0 {
		return 0, false
	}
	if d, ok := seconds(strings.TrimSpace(resetAfter)); ok {
		return d, true
	}
	v, ok := nonNegative(strings.TrimSpace(reset))
	if !ok {
		return 0, false
	}
	if v >= 1e10 { // past 2286 in Unix seconds: milliseconds, or noise
		return 0, false
	}
	if v >= 1e9 { // a moment, not a wait
		return max(0, time.Unix(0, int64(v*1e9)).Sub(now)), true
	}
	return secondsOf(v), true
}

// wholeNumber reads a non-negative integer.
func wholeNumber(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// seconds reads a non-negative number of seconds (fractions allowed),
// short of a Unix time.
func seconds(s string) (time.Duration, bool) {
	v, ok := nonNegative(s)
	if !ok || v >= 1e9 {
		return 0, false
	}
	return secondsOf(v), true
}

// nonNegative reads a finite number, zero or more.
func nonNegative(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil && v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v)
}

func secondsOf(v float64) time.Duration { return time.Duration(math.Ceil(v * float64(time.Second))) }

// splitOutsideQuotes splits s at sep, except inside a quoted string (a
// quota's name may hold a comma or a semicolon).
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
