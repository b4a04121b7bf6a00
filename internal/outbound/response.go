package outbound

import (
	"encoding/base64"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Keep is what is kept of an answer on the job: its status, the headers
// Content-Type, Location, Retry-After and keep_response_headers (several
// values of one name joined with ", "), and at most keep_response_bytes of
// body, as text when it is UTF-8, else in base64. truncated says the
// caller read only part of a longer body; Keep sets it too when it cuts
// body itself. h is the answer's headers: nothing of the request is kept.
func (o *Downstream) Keep(status int, h http.Header, body []byte, truncated bool) *queue.Response {
	r := &queue.Response{Status: status, Headers: map[string]string{}, Truncated: truncated}
	for _, name := range o.keepHs {
		if vs := h.Values(name); len(vs) > 0 {
			r.Headers[name] = strings.Join(vs, ", ")
		}
	}
	kept := body
	if len(kept) > o.keep {
		kept, r.Truncated = kept[:o.keep], true
		kept = cutRune(kept)
	}
	switch {
	case len(kept) == 0:
	case utf8.Valid(kept):
		r.Body = string(kept)
	default:
		r.BodyBase64 = base64.StdEncoding.EncodeToString(kept)
	}
	return r
}

// cutRune drops a rune that the cut at the end of b split (up to 3
// bytes), so text cut short stays text.
func cutRune(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}
