package outbound

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
)

// stripeLike allows what a Stripe downstream would.
func stripeLike(t *testing.T, body string) *Downstream {
	return compile(t, config.Downstream{
		URL:        "https://api.stripe.com/v1/charges?api_version=2024",
		Body:       body,
		Auth:       config.DownstreamAuth{Type: "header", Name: "X-Api-Key", ValueFile: secretFile(t, stripeKey)},
		JobPaths:   []string{"/v1/*", "/v2/exact"},
		JobMethods: []string{"GET", "DELETE"},
		JobHeaders: []string{"Stripe-Account", "Stripe-Version"},
	})
}

func TestCheckRefuses(t *testing.T) {
	t.Parallel()
	const (
		notAllowed   = CodeRequestNotAllowed
		notEncodable = CodePayloadNotEncodable
	)
	hdr := func(k, v string) *JobRequest { return &JobRequest{Headers: map[string]string{k: v}} }
	path := func(p string) *JobRequest { return &JobRequest{Path: p} }
	cases := []struct {
		name, body, payload string
		req                 *JobRequest
		code, part, reason  string
	}{
		{"form from an array", "form", `[1, 2]`, nil, notEncodable, "payload", "JSON object"},
		{"form from a string", "form", `"a=1"`, nil, notEncodable, "payload", "JSON object"},
		{"form with an empty name", "form", `{"a": {"": 1}}`, nil, notEncodable, "payload", "empty name (in a)"},
		{"raw from an object", "raw", `{"a": 1}`, nil, notEncodable, "payload", "JSON string"},
		{"raw from a number", "raw", `12`, nil, notEncodable, "payload", "JSON string"},
		{"json not JSON", "json", `{"a":`, nil, notEncodable, "payload", "not JSON"},
		{"path outside job_paths", "json", ``, path("/v3/x"), notAllowed, "request.path", "downstreams.v.job_paths allows /v1/*, /v2/exact"},
		{"exact pattern only", "json", ``, path("/v2/exact/more"), notAllowed, "request.path", "job_paths allows"},
		{"dot dot", "json", ``, path("/v1/../admin"), notAllowed, "request.path", ".. or empty"},
		{"dot", "json", ``, path("/v1/./x"), notAllowed, "request.path", ".. or empty"},
		{"trailing dot dot", "json", ``, path("/v1/.."), notAllowed, "request.path", ".. or empty"},
		{"double slash", "json", ``, path("/v1//x"), notAllowed, "request.path", "empty (//)"},
		{"encoded dot dot", "json", ``, path("/v1/%2e%2E/admin"), notAllowed, "request.path", ".. or empty"},
		{"half-encoded dot dot", "json", ``, path("/v1/.%2e/admin"), notAllowed, "request.path", ".. or empty"},
		{"dot dot with params", "json", ``, path("/v1/..;x/admin"), notAllowed, "request.path", ".. or empty"},
		{"encoded slash", "json", ``, path("/v1/a%2fb"), notAllowed, "request.path", "escaped /"},
		{"encoded backslash", "json", ``, path("/v1/a%5Cb"), notAllowed, "request.path", "escaped /"},
		{"backslash", "json", ``, path("/v1/a\\..\\b"), notAllowed, "request.path", "escaped /"},
		{"bad escape", "json", ``, path("/v1/%zz"), notAllowed, "request.path", "percent-encoding"},
		{"encoded newline", "json", ``, path("/v1/a%0d%0aHost:x"), notAllowed, "request.path", "control character"},
		{"scheme and host", "json", ``, path("https://evil.example/v1/x"), notAllowed, "request.path", "absolute path"},
		{"network path", "json", ``, path("//evil.example/v1/x"), notAllowed, "request.path", "empty (//)"},
		{"relative", "json", ``, path("v1/x"), notAllowed, "request.path", "absolute path"},
		{"query in path", "json", ``, path("/v1/x?a=1"), notAllowed, "request.path", "request.query"},
		{"fragment in path", "json", ``, path("/v1/x#a"), notAllowed, "request.path", "request.query"},
		{"query the url sets", "json", ``, &JobRequest{Query: Query{"api_version": {"2020"}}}, notAllowed, "request.query.api_version", "downstreams.v.url"},
		{"header not allowed", "json", ``, hdr("X-Other", "1"), notAllowed, "request.headers.X-Other", "job_headers allows Stripe-Account, Stripe-Version"},
		{"authorization", "json", ``, hdr("authorization", "Bearer x"), notAllowed, "request.headers.authorization", "throttler's"},
		{"auth's header", "json", ``, hdr("x-API-key", "x"), notAllowed, "request.headers.x-API-key", "throttler's"},
		{"host", "json", ``, hdr("HOST", "evil"), notAllowed, "request.headers.HOST", "throttler's"},
		{"content-type", "json", ``, hdr("content-type", "text/xml"), notAllowed, "request.headers.content-type", "throttler's"},
		{"idempotency", "json", ``, hdr("IDEMPOTENCY-KEY", "x"), notAllowed, "request.headers.IDEMPOTENCY-KEY", "throttler's"},
		{"x-throttler", "json", ``, hdr("x-throttler-tenant", "other"), notAllowed, "request.headers.x-throttler-tenant", "throttler's"},
		{"webhook", "json", ``, hdr("Webhook-Signature", "v1,x"), notAllowed, "request.headers.Webhook-Signature", "throttler's"},
		{"proxy", "json", ``, hdr("Proxy-Authorization", "x"), notAllowed, "request.headers.Proxy-Authorization", "throttler's"},
		{"cookie", "json", ``, hdr("cookie", "a=b"), notAllowed, "request.headers.cookie", "throttler's"},
		{"bad header name", "json", ``, hdr("Stripe Account", "x"), notAllowed, "request.headers", "not a header name"},
		{"CR LF in a value", "json", ``, hdr("Stripe-Account", "acct\r\nHost: evil"), notAllowed, "request.headers.Stripe-Account", "CR, LF, NUL"},
		{"NUL in a value", "json", ``, hdr("Stripe-Account", "a\x00"), notAllowed, "request.headers.Stripe-Account", "CR, LF, NUL"},
		{"twice", "json", ``, &JobRequest{Headers: map[string]string{"stripe-account": "a", "Stripe-Account": "b"}}, notAllowed, "request.headers.stripe-account", "twice"},
		{"over 8 KiB", "json", ``, &JobRequest{Headers: map[string]string{"Stripe-Account": strings.Repeat("a", 4090), "Stripe-Version": strings.Repeat("b", 4090)}}, notAllowed, "request.headers", "8192 bytes"},
		{"body on GET", "json", `{"a": 1}`, &JobRequest{Method: "GET"}, notEncodable, "payload", "a GET sends no body"},
		{"body on DELETE", "form", `{"a": 1}`, &JobRequest{Method: "delete", Path: "/v1/x"}, notEncodable, "payload", "a DELETE sends no body"},
		{"method not allowed", "json", ``, &JobRequest{Method: "PUT"}, notAllowed, "request.method", "job_methods allows POST, GET, DELETE"},
		{"method not a method", "json", ``, &JobRequest{Method: "BREW"}, notAllowed, "request.method", "not allowed"},
	}
	for _, c := range cases {
		o := stripeLike(t, c.body)
		err := o.Check(json.RawMessage(c.payload), c.req)
		var na *NotAllowedError
		if !errors.As(err, &na) || na.Code != c.code || na.Part != c.part || !strings.Contains(na.Reason, c.reason) {
			t.Errorf("%s: got %#v (%v); want %s %s %q", c.name, na, err, c.code, c.part, c.reason)
			continue
		}
		if !strings.HasPrefix(err.Error(), c.part+": ") || strings.Contains(err.Error(), "acct\r") || strings.Contains(err.Error(), stripeKey) {
			t.Errorf("%s: message %q", c.name, err)
		}
		// What Check refuses, Build refuses the same way.
		if _, _, berr := o.Build(context.Background(), BuildJob{ID: "x", Payload: json.RawMessage(c.payload), Request: c.req}); berr == nil || berr.Error() != err.Error() {
			t.Errorf("%s: Build gave %v", c.name, berr)
		}
	}
}

func TestCheckAllows(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body, payload string
		req           *JobRequest
		url           string
	}{
		{"json", `{"a": 1}`, nil, "https://api.stripe.com/v1/charges?api_version=2024"},
		{"json", ``, &JobRequest{Method: "get", Path: "/v1/charges/ch_1"}, "https://api.stripe.com/v1/charges/ch_1?api_version=2024"},
		{"json", `null`, &JobRequest{Method: "DELETE", Path: "/v2/exact"}, "https://api.stripe.com/v2/exact?api_version=2024"},
		{"json", `1`, &JobRequest{Path: "/v1/a%20b/%C3%A9;x=1/"}, "https://api.stripe.com/v1/a%20b/%C3%A9;x=1/?api_version=2024"},
		{"json", `1`, &JobRequest{Path: "/v1/a b/é"}, "https://api.stripe.com/v1/a%20b/%C3%A9?api_version=2024"},
		{"json", `1`, &JobRequest{Path: "/v1/..a/a..", Query: Query{"expand[]": {"a", "b"}}}, "https://api.stripe.com/v1/..a/a..?api_version=2024&expand%5B%5D=a&expand%5B%5D=b"},
		{"form", ``, &JobRequest{Path: "/v1/x", Headers: map[string]string{"stripe-account": "acct_1", "STRIPE-VERSION": "2024\tx ü"}}, "https://api.stripe.com/v1/x?api_version=2024"},
		{"form", `{"a": [[1, 2], [3]], "b": {}, "c": []}`, nil, ""},
		{"raw", `"<a/>"`, nil, ""},
		{"raw", `null`, nil, ""},
	}
	for _, c := range cases {
		o := stripeLike(t, c.body)
		if err := o.Check(json.RawMessage(c.payload), c.req); err != nil {
			t.Errorf("%+v: %v", c, err)
			continue
		}
		req, _, err := o.Build(context.Background(), BuildJob{ID: "x", Payload: json.RawMessage(c.payload), Request: c.req})
		if err != nil {
			t.Fatal(err)
		}
		if c.url != "" && req.URL.String() != c.url {
			t.Errorf("url %s, want %s", req.URL, c.url)
		}
	}
}

// A protected header wins in any case: a static header or a job header
// never replaces throttler's own, even one built around the config checks.
func TestProtectedHeadersWin(t *testing.T) {
	t.Parallel()
	o := compile(t, config.Downstream{URL: "https://x.example/", JobHeaders: []string{"X-Ok"}, Auth: config.DownstreamAuth{Type: "bearer", TokenFile: secretFile(t, stripeKey)}})
	o.staticHeaders = append(o.staticHeaders, [2]string{"Authorization", "Bearer stolen"}, [2]string{"X-Throttler-Tenant", "other"})
	req, _, err := o.Build(context.Background(), BuildJob{ID: "id", Tenant: "acme", Attempt: 1, Request: &JobRequest{Headers: map[string]string{"x-ok": "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if req.Header.Get("Authorization") != "Bearer "+stripeKey || req.Header.Get("X-Throttler-Tenant") != "acme" || req.Header.Get("X-Ok") != "1" {
		t.Errorf("%v", req.Header)
	}
}
