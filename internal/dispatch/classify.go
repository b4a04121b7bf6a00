package dispatch

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Backoff bounds for 5xx, timeouts and connection errors.
const (
	BackoffBase = time.Second
	BackoffCap  = 5 * time.Minute
)

// backoff is capped exponential backoff with full jitter: uniform in
// [0, min(cap, base * 2^(attempt-1))]. attempt counts from 1.
func backoff(attempt int, r *rand.Rand) time.Duration {
	ceiling := BackoffCap
	if attempt <= 20 {
		ceiling = min(BackoffCap, BackoffBase<<(attempt-1))
	}
	return time.Duration(r.Int64N(int64(ceiling) + 1))
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(h, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(h); err == nil {
		return max(0, at.Sub(now)), true
	}
	return 0, false
}

// excerpt is the start of a response body, fit for last_error.
func excerpt(body []byte) string {
	const limit = 512
	s := string(body)
	if len(s) > limit {
		s = s[:limit]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return strings.TrimSpace(s)
}

func statusError(status int, body []byte) string {
	msg := fmt.Sprintf("%d %s", status, http.StatusText(status))
	if e := excerpt(body); e != "" {
		msg += ": " + e
	}
	return msg
}
