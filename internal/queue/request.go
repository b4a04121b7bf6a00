package queue

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// JobRequest is what a job may ask of its downstream's request (the job's
// "request" field): a method, a path under the downstream url's
// scheme://host, query parameters and headers, each only as far as the
// downstream allows (Check).
type JobRequest struct {
	Method  string            `json:"method,omitempty"`
	Path    string            `json:"path,omitempty"`
	Query   Query             `json:"query,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Query is a job's query parameters. In JSON each takes a string or an
// array of strings: {"expand[]": "charge", "id": ["a", "b"]}; null is as
// if absent.
type Query map[string][]string

// UnmarshalJSON takes a string or an array of strings per name.
func (q *Query) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("query must be an object of strings or arrays of strings")
	}
	if raw == nil {
		*q = nil
		return nil
	}
	out := make(Query, len(raw))
	for name, v := range raw {
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			continue // as if absent
		}
		var one string
		if err := json.Unmarshal(v, &one); err == nil {
			out[name] = []string{one}
			continue
		}
		var many []string
		if err := json.Unmarshal(v, &many); err != nil {
			return fmt.Errorf("query %q must be a string or an array of strings", name)
		}
		out[name] = many
	}
	*q = out
	return nil
}
