package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
)

func FuzzEncodeForm(f *testing.F) {
	for _, s := range []string{
		`{"To": "+1555", "MediaUrl": ["a", "b"], "x": null}`,
		`{"metadata": {"order_id": "6735"}, "items": [{"price": "p", "quantity": 2}]}`,
		`{"a": [[1, 2], [3, {"b": true}]], "": 1}`,
		`{"s": "a&b=c%d\u0000é"}`,
		`[1]`, `"x"`, `{"a": 1e400}`, `{"a": {"b": {"c": [null, -0.0]}}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, payload []byte, indexed bool) {
		arrays := config.FormRepeat
		if indexed {
			arrays = config.FormIndexed
		}
		got, err := EncodeForm(payload, arrays)
		if err != nil {
			return
		}
		if !json.Valid(payload) {
			t.Fatalf("encoded invalid JSON %q", payload)
		}
		if _, err := url.ParseQuery(string(got)); err != nil {
			t.Fatalf("%q does not parse: %v", got, err)
		}
		again, _ := EncodeForm(payload, arrays)
		if !bytes.Equal(got, again) {
			t.Fatalf("not deterministic: %q then %q", got, again)
		}
	})
}

// fuzzDownstream allows a job much: form body, paths under /v1/, GET and
// DELETE, two headers; its url has a query of its own.
func fuzzDownstream(f *testing.F, body string) *Downstream {
	o, err := Compile("fuzz", config.Downstream{
		URL:        "https://api.vendor.example/base?fixed=1",
		Body:       body,
		Auth:       config.DownstreamAuth{Type: "bearer", TokenFile: secretFile(f, stripeKey)},
		JobPaths:   []string{"/v1/*", "/exact"},
		JobMethods: []string{"GET", "DELETE", "PUT"},
		JobHeaders: []string{"Stripe-Account", "X-Extra"},
	})
	if err != nil {
		f.Fatal(err)
	}
	return o
}

func FuzzCheckAndBuild(f *testing.F) {
	for _, s := range []struct{ payload, req string }{
		{`{"a": 1}`, `{}`},
		{`{"a": [1, {"b": 2}]}`, `{"path": "/v1/refunds", "query": {"expand[]": "charge"}, "headers": {"Stripe-Account": "acct_1"}}`},
		{`null`, `{"method": "get", "path": "/v1/a%20b/c"}`},
		{`"raw"`, `{"path": "/v1/%2e%2e/admin"}`},
		{`{}`, `{"path": "//evil.example/v1/x"}`},
		{`{}`, `{"headers": {"authorization": "x", "x-extra": "a\r\nb"}}`},
		{`{}`, `{"query": {"fixed": "2"}, "method": "DELETE"}`},
		{`[1]`, `{"path": "/exact"}`},
	} {
		for kind := byte(0); kind < 3; kind++ {
			f.Add([]byte(s.payload), []byte(s.req), kind)
		}
	}
	compiled := []*Downstream{fuzzDownstream(f, "json"), fuzzDownstream(f, "form"), fuzzDownstream(f, "raw")}
	f.Fuzz(func(t *testing.T, payload, request []byte, kind byte) {
		o := compiled[int(kind)%len(compiled)]
		var r JobRequest
		if json.Unmarshal(request, &r) != nil {
			return
		}
		if o.Check(payload, &r) != nil {
			return
		}
		req, body, err := o.Build(context.Background(), BuildJob{ID: "job-1", Tenant: "acme", Attempt: 1, Payload: payload, Request: &r})
		if err != nil {
			t.Fatalf("Check passed, Build failed: %v", err)
		}
		if req.URL.Scheme != "https" || req.URL.Host != "api.vendor.example" || req.Host != "api.vendor.example" {
			t.Fatalf("the job chose the host: %s", req.URL)
		}
		if p := req.URL.Path; r.Path != "" {
			clean := path.Clean(p) // no ., .. or empty segments left
			if strings.HasSuffix(p, "/") {
				clean += "/"
			}
			if clean != p || !(strings.HasPrefix(p, "/v1/") || p == "/exact") {
				t.Fatalf("path %q from %q", p, r.Path)
			}
		}
		if q, err := url.ParseQuery(req.URL.RawQuery); err != nil || len(q["fixed"]) != 1 || q.Get("fixed") != "1" {
			t.Fatalf("query %q: %v", req.URL.RawQuery, err)
		}
		want := map[string]string{"Authorization": "Bearer " + stripeKey, "Idempotency-Key": "job-1", "X-Throttler-Tenant": "acme", "X-Throttler-Attempt": "1", "User-Agent": "throttler"}
		for name, v := range want {
			if got := req.Header.Values(name); len(got) != 1 || got[0] != v {
				t.Fatalf("%s: %q", name, got)
			}
		}
		for name, vs := range req.Header {
			if !config.ValidHeaderName(name) || len(vs) != 1 || !config.ValidHeaderValue(vs[0]) {
				t.Fatalf("header %q: %q", name, vs)
			}
			if _, ours := want[name]; !ours && name != "Content-Type" && name != "Stripe-Account" && name != "X-Extra" {
				t.Fatalf("header %s came from the job", name)
			}
		}
		if (req.Method == "GET" || req.Method == "DELETE") != (body == nil && req.Body == nil) {
			t.Fatalf("%s with body %q", req.Method, body)
		}
	})
}

// FuzzEncodeFormAgainstReference holds EncodeForm (a scanner over the
// payload's bytes) to encodeFormRef (json.Decoder's tokens): the same
// bytes for every payload, and the same refusal, word for word, but for
// the syntax error's own text, which json.Decoder words by how it read.
func FuzzEncodeFormAgainstReference(f *testing.F) {
	for _, s := range []string{
		`{"To": "+1555", "MediaUrl": ["a", "b"], "x": null}`,
		`{"metadata": {"order_id": "6735"}, "items": [{"price": "p", "quantity": 2}]}`,
		`{"a": [[1, 2], [3, {"b": true}]], "c": [null, {"": 1}]}`,
		`{"s": "a&b=c%d\u0000é\ud83d\ude00\ud800x\udc00\"\\\/\b\f\n\r\t", "\u00e9\t": "x"}`,
		"{\"bad utf-8\": \"\xff\xfe\xe2\x82\", \"\xc3\": [\"\xed\xa0\x80\"]}",
		`{"a": [1, [2, "]", "[", {"}": "{"}]], "b": ["x,y", -1.5e+3, false]}`,
		`[1]`, `"x"`, `{"a": 1e400}`, `{"a": {"b": {"c": [null, -0.0]}}}`, `{"a": 1} {}`, `{"a": `, ``, ` {"": {}} `,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, payload []byte, indexed bool) {
		arrays := config.FormRepeat
		if indexed {
			arrays = config.FormIndexed
		}
		got, err := EncodeForm(payload, arrays)
		want, wantErr := encodeFormRef(payload, arrays)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("%q (%s): got %q %v, want %q %v", payload, arrays, got, err, want, wantErr)
		}
		if err == nil || strings.HasPrefix(wantErr.Error(), "is not JSON: ") && strings.HasPrefix(err.Error(), "is not JSON: ") {
			return
		}
		if err.Error() != wantErr.Error() {
			t.Fatalf("%q: refused with %q, want %q", payload, err, wantErr)
		}
	})
}
