package outbound

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/textproto"
	"net/url"
	"slices"
	"strings"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

// JobRequest is what a job may ask of its downstream's request: the
// queue keeps it with the job (queue.JobRequest).
type JobRequest = queue.JobRequest

// Query is a job's query parameters (queue.Query).
type Query = queue.Query

// Codes of a NotAllowedError, as the API answers them (422).
const (
	CodeRequestNotAllowed   = "request_not_allowed"
	CodePayloadNotEncodable = "payload_not_encodable"
)

// NotAllowedError is a job whose request the downstream cannot make: its
// request asks what the downstream does not allow (request_not_allowed),
// or its payload does not fit the body kind (payload_not_encodable). Part
// names the job's part ("request.path", "request.headers.X-Foo",
// "payload"); Reason says what is wrong and what is allowed, naming the
// config key. Neither holds a header value.
type NotAllowedError struct {
	Code   string
	Part   string
	Reason string
}

func (e *NotAllowedError) Error() string { return e.Part + ": " + e.Reason }

// MaxJobHeaderBytes bounds a job's headers, names and values together.
const MaxJobHeaderBytes = 8 << 10

// Check is the admission check of a job for this downstream: a job that
// passes it builds (Build) with this Downstream. The error is a
// *NotAllowedError.
func (o *Downstream) Check(payload json.RawMessage, r *JobRequest) error {
	_, err := o.plan(payload, r)
	return err
}

// plan is a request decided but not yet made: what Check checks and Build
// builds from.
type plan struct {
	method   string
	url      string
	headers  [][2]string // the job's, canonical names, sorted
	body     []byte
	sendBody bool
}

func (o *Downstream) plan(payload json.RawMessage, r *JobRequest) (plan, error) {
	if r == nil {
		r = &JobRequest{}
	}
	var p plan
	var err error
	if p.method, err = o.jobMethod(r.Method); err != nil {
		return p, err
	}
	if p.url, err = o.jobURL(r.Path, r.Query); err != nil {
		return p, err
	}
	if p.headers, err = o.jobHeaderList(r.Headers); err != nil {
		return p, err
	}
	if o.cfg.Handler != "" {
		return p, nil // a Go handler takes the payload as it came: no body to encode
	}
	p.sendBody = p.method != "GET" && p.method != "DELETE"
	p.body, err = o.encodeBody(p.method, p.sendBody, payload)
	return p, err
}

func notAllowed(part, format string, args ...any) error {
	return &NotAllowedError{Code: CodeRequestNotAllowed, Part: part, Reason: fmt.Sprintf(format, args...)}
}

func (o *Downstream) jobMethod(m string) (string, error) {
	if m == "" {
		return o.cfg.Method, nil
	}
	if up := strings.ToUpper(m); slices.Contains(o.jobMethods, up) {
		return up, nil
	}
	return "", notAllowed("request.method", "%q is not allowed: %s.job_methods allows %s", m, o.key, strings.Join(o.jobMethods, ", "))
}

// jobURL is the downstream url, or its scheme://host with the job's path,
// and the url's own query followed by the job's.
func (o *Downstream) jobURL(path string, q Query) (string, error) {
	u := *o.base
	if path != "" {
		decoded, err := o.checkPath(path)
		if err != nil {
			return "", err
		}
		u.Path, u.RawPath = decoded, path
	}
	for _, name := range sortedKeys(q) {
		if o.baseQuery.Has(name) {
			return "", notAllowed("request.query."+name, "is set by %s.url: a job cannot change it", o.key)
		}
	}
	if extra := url.Values(q).Encode(); extra != "" {
		u.RawQuery = strings.TrimPrefix(u.RawQuery+"&"+extra, "&")
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String(), nil
}

// checkPath checks a job's path (as sent: percent-escapes allowed) and
// returns it decoded. The segment rules run on the decoded path, so an
// escaped dot segment (%2e%2e) is refused like a plain one; an escaped
// slash or backslash is refused outright, since servers disagree on
// whether it separates segments.
func (o *Downstream) checkPath(raw string) (string, error) {
	part := "request.path"
	if !strings.HasPrefix(raw, "/") {
		return "", notAllowed(part, "%q must be an absolute path starting with / (no scheme or host: the url's are used)", raw)
	}
	if strings.ContainsAny(raw, "?#") {
		return "", notAllowed(part, "%q holds ? or #: give query parameters in request.query", raw)
	}
	decoded, err := url.PathUnescape(raw)
	if err != nil {
		return "", notAllowed(part, "%q is not a valid percent-encoding", raw)
	}
	lower := strings.ToLower(raw)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(decoded, "\\") {
		return "", notAllowed(part, "%q holds an escaped / or a \\: segments are separated by / alone", raw)
	}
	if !config.ValidHeaderValue(decoded) || strings.Contains(decoded, "\t") {
		return "", notAllowed(part, "%q holds a control character", raw)
	}
	segs := strings.Split(decoded[1:], "/")
	for i, s := range segs {
		s, _, _ = strings.Cut(s, ";") // "..;x" is ".." to some servers
		if s == "." || s == ".." || (s == "" && i < len(segs)-1) {
			return "", notAllowed(part, "%q holds a ., .. or empty (//) segment", raw)
		}
	}
	for _, pat := range o.cfg.JobPaths {
		if prefix, ok := strings.CutSuffix(pat, "*"); (ok && strings.HasPrefix(decoded, prefix)) || decoded == pat {
			return decoded, nil
		}
	}
	if len(o.cfg.JobPaths) == 0 {
		return "", notAllowed(part, "a job cannot choose the path: %s.job_paths is empty", o.key)
	}
	return "", notAllowed(part, "%q is not allowed: %s.job_paths allows %s", raw, o.key, strings.Join(o.cfg.JobPaths, ", "))
}

// jobHeaderList checks the job's headers, sorted by canonical name.
func (o *Downstream) jobHeaderList(h map[string]string) ([][2]string, error) {
	var out [][2]string
	size := 0
	for _, name := range sortedKeys(h) {
		part := "request.headers." + name
		if !config.ValidHeaderName(name) {
			return nil, notAllowed("request.headers", "%q is not a header name", name)
		}
		canon := textproto.CanonicalMIMEHeaderKey(name)
		if o.cfg.ProtectedHeader(name) || o.authName == canon {
			return nil, notAllowed(part, "is throttler's: a job may never set it")
		}
		if !o.jobHeaders[canon] {
			return nil, notAllowed(part, "is not allowed: %s.job_headers allows %s", o.key, cmpList(sortedKeys(o.jobHeaders)))
		}
		if !config.ValidHeaderValue(h[name]) {
			return nil, notAllowed(part, "the value holds CR, LF, NUL or another control character: a header is one line")
		}
		if slices.ContainsFunc(out, func(kv [2]string) bool { return kv[0] == canon }) {
			return nil, notAllowed(part, "is given twice (header names are case-insensitive)")
		}
		if size += len(name) + len(h[name]); size > MaxJobHeaderBytes {
			return nil, notAllowed("request.headers", "more than %d bytes of names and values", MaxJobHeaderBytes)
		}
		out = append(out, [2]string{canon, h[name]})
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out, nil
}

func cmpList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// encodeBody makes the body of a request with this method from the
// payload. An absent or null payload sends an empty body with form and
// raw; json sends the payload as it came.
func (o *Downstream) encodeBody(method string, sendBody bool, payload json.RawMessage) ([]byte, error) {
	trimmed := bytes.TrimSpace(payload)
	empty := len(trimmed) == 0 || string(trimmed) == "null"
	bad := func(format string, args ...any) error {
		return &NotAllowedError{Code: CodePayloadNotEncodable, Part: "payload", Reason: fmt.Sprintf(format, args...)}
	}
	if !sendBody {
		if !empty {
			return nil, bad("a %s sends no body: the payload must be absent or null", method)
		}
		return nil, nil
	}
	switch {
	case o.cfg.Body == config.BodyJSON:
		if len(trimmed) > 0 && !json.Valid(payload) {
			return nil, bad("is not JSON")
		}
		return payload, nil
	case empty:
		return nil, nil
	case o.cfg.Body == config.BodyForm:
		b, err := EncodeForm(payload, o.cfg.FormArrays)
		if err != nil {
			return nil, bad("%v (%s.body is \"form\")", err, o.key)
		}
		return b, nil
	}
	var s string // raw
	if trimmed[0] != '"' || json.Unmarshal(trimmed, &s) != nil {
		return nil, bad("must be a JSON string for body = \"raw\" (%s): its text is the body", o.key)
	}
	return []byte(s), nil
}
