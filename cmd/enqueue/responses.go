package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/throttler-dev/throttler/client"
)

// With --wait, the summary says how each job ended and what its downstream
// answered: the kept status and the start of the kept body, bounded so that
// a vendor's long answer (or a file of many jobs) cannot flood the output.

const (
	// maxShownBody bounds the body shown of each answer, in bytes.
	maxShownBody = 512
	// maxShownJobs bounds the jobs the text summary lists (the JSON one
	// lists them all).
	maxShownJobs = 10
)

// outcome is how one job ended, as the summary shows it.
type outcome struct {
	Line   int    `json:"line"`
	ID     string `json:"id"`
	State  string `json:"state"`
	Status int    `json:"response_status,omitempty"`
	// Body is the start of the kept body (text; for bytes that are not
	// UTF-8, their base64 and BodyBase64 set); Truncated: there was more.
	Body       string `json:"response_body,omitempty"`
	BodyBase64 bool   `json:"response_body_base64,omitempty"`
	Truncated  bool   `json:"response_truncated,omitempty"`
	LastError  string `json:"last_error,omitempty"`
}

// outcomes are the ended jobs' outcomes, in file order.
func outcomes(items []*item) []outcome {
	var out []outcome
	for _, it := range items {
		if !it.accepted || !it.final.Finished() {
			continue
		}
		j := it.final
		o := outcome{Line: it.line, ID: j.ID, State: j.State, Status: j.ResponseStatus, LastError: j.LastError}
		if r := j.Response; r != nil {
			o.Status = r.Status
			o.Body, o.Truncated = bounded(r.Body, maxShownBody)
			if r.BodyBase64 != "" {
				o.Body, o.Truncated = bounded(r.BodyBase64, maxShownBody)
				o.BodyBase64 = true
			}
			o.Truncated = o.Truncated || r.Truncated
		}
		out = append(out, o)
	}
	return out
}

// bounded is s cut to at most n bytes on a rune boundary, and whether it
// was cut.
func bounded(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// printOutcomes lists how the jobs ended, failed ones first, at most
// maxShownJobs of them, one line each.
func printOutcomes(w io.Writer, list []outcome) {
	var failed, rest []outcome
	for _, o := range list {
		if o.State == "succeeded" {
			rest = append(rest, o)
		} else {
			failed = append(failed, o)
		}
	}
	list = append(failed, rest...)
	for i, o := range list {
		if i == maxShownJobs {
			fmt.Fprintf(w, "  ... and %d more (each with GET /v1/jobs/{id}, or --json for all)\n", len(list)-i)
			return
		}
		fmt.Fprintln(w, "  "+o.text())
	}
}

// text is one job's line: where it came from, how it ended, the answer.
func (o outcome) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "line %d, job %s: %s", o.Line, o.ID, o.State)
	if o.Status == 0 {
		if o.LastError != "" {
			b.WriteString(" (" + oneLine(o.LastError) + ")")
		}
		return b.String()
	}
	fmt.Fprintf(&b, ", response %d", o.Status)
	switch {
	case o.BodyBase64:
		b.WriteString(" (bytes, base64) " + o.Body)
	case o.Body != "":
		b.WriteString(" " + oneLine(o.Body))
	}
	if o.Truncated {
		b.WriteString(" …(truncated)")
	}
	return b.String()
}

// oneLine shows s on one line: a JSON body compacted, other text with its
// line breaks and control characters escaped.
func oneLine(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) == nil {
		s = b.String()
	}
	var out strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			out.WriteString(`\n`)
		case r == '\r':
			out.WriteString(`\r`)
		case r == '\t':
			out.WriteString(`\t`)
		case r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029':
			fmt.Fprintf(&out, `\u%04x`, r)
		default:
			out.WriteRune(r)
		}
	}
	return out.String()
}

// parseRequest reads --request: {"method", "path", "query", "headers"},
// each query name taking a string or an array of strings, as the API does.
func parseRequest(s string) (*client.Request, error) {
	if s == "" {
		return nil, nil
	}
	var in struct {
		Method  string            `json:"method"`
		Path    string            `json:"path"`
		Query   map[string]any    `json:"query"`
		Headers map[string]string `json:"headers"`
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("--request: %v; want JSON such as {\"method\":\"POST\",\"path\":\"/v1/refunds\",\"query\":{\"expand[]\":\"charge\"},\"headers\":{\"Stripe-Account\":\"acct_1\"}}", err)
	}
	r := &client.Request{Method: in.Method, Path: in.Path, Headers: in.Headers}
	for name, v := range in.Query {
		if r.Query == nil {
			r.Query = map[string][]string{}
		}
		switch v := v.(type) {
		case string:
			r.Query[name] = []string{v}
		case []any:
			for _, e := range v {
				str, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("--request: query %q must be a string or an array of strings", name)
				}
				r.Query[name] = append(r.Query[name], str)
			}
		case nil:
		default:
			return nil, fmt.Errorf("--request: query %q must be a string or an array of strings", name)
		}
	}
	return r, nil
}

// firstRefusal says why the first job refused for good (422, or 429
// schedule_full) was refused, for the run's error ("" if none was).
func firstRefusal(items []*item) string {
	for _, it := range items {
		var full *client.ScheduleFullError
		if it.given && it.result.Err != nil && (it.result.Status == 422 || errors.As(it.result.Err, &full)) {
			return fmt.Sprintf("; line %d: %v", it.line, it.result.Err)
		}
	}
	return ""
}
