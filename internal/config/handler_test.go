package config

import (
	"errors"
	"strings"
	"testing"
)

// A downstream may be a Go handler instead of a url (DESIGN.md section
// 6d): it keeps the keys of pacing, retries, kept answers and a job's
// request, and its defaults are filled as for a url.
func TestHandlerDownstreamLoads(t *testing.T) {
	t.Parallel()
	p := writeFile(t, `
[downstreams.sms]
handler = "sms-sender"
timeout = "2s"
rate = "100/s"
windows = ["1000/h"]
max_attempts = 3
keep_response_bytes = 100
job_paths = ["/v1/*"]
job_methods = ["put"]
job_headers = ["X-Tag"]
[downstreams.mail]
handler = "sms-sender"
[downstreams.web]
url = "http://127.0.0.1:9000/send"
[tenant_defaults]
downstream = "sms"
`)
	c, err := Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Downstreams["sms"]
	if d.Handler != "sms-sender" || d.URL != "" || d.Timeout.Std().Seconds() != 2 || d.MaxAttempts != 3 || d.Ceiling() == nil ||
		d.KeepBytes() != 100 || d.JobMethods[0] != "PUT" || d.Method != "" {
		t.Fatalf("handler downstream: %+v", d)
	}
	if m := c.Downstreams["mail"]; m.MaxAttempts != 5 || m.Timeout.Std().Seconds() != 5 {
		t.Fatalf("handler defaults: %+v", m)
	}
	want := [][2]string{{"sms-sender", "downstreams.mail.handler"}}
	if got := c.Handlers(); len(got) != 1 || got[0] != want[0] {
		t.Fatalf("Handlers() = %v, want %v (each handler once, with the first key naming it)", got, want)
	}
}

// The keys that only shape an HTTP request are refused on a handler,
// naming the key; so are both url and handler, and neither.
func TestHandlerDownstreamRefused(t *testing.T) {
	t.Parallel()
	cases := []struct{ body, key, reason string }{
		{"url = \"http://x/\"\nhandler = \"h\"", "downstreams.v", "exactly one of url"},
		{"timeout = \"1s\"", "downstreams.v.url", "handler = \"NAME\""},
		{"handler = \"a b\"", "downstreams.v.handler", "not a handler name"},
		{"handler = \"h\"\nmethod = \"PUT\"", "downstreams.v.method", "calls the Go handler \"h\""},
		{"handler = \"h\"\nbody = \"form\"", "downstreams.v.body", "remove it"},
		{"handler = \"h\"\nheaders = { A = \"b\" }", "downstreams.v.headers", "remove it"},
		{"handler = \"h\"\nauth = { type = \"bearer\", token_env = \"T\" }", "downstreams.v.auth", "authentication"},
		{"handler = \"h\"\nidempotency_header = \"\"", "downstreams.v.idempotency_header", "remove it"},
		{"handler = \"h\"\ntls_ca_file = \"/ca.pem\"", "downstreams.v.tls_ca_file", "authentication"},
		{"handler = \"h\"\nsigning_secret_env = \"S\"", "downstreams.v.signing_secret_env", "signing"},
		{"handler = \"h\"\nkeep_response_headers = [\"X-A\"]", "downstreams.v.keep_response_headers", "bytes it returns"},
		{"handler = \"h\"\nrate_limit_headers = \"ietf\"", "downstreams.v.rate_limit_headers", "returns a pushback error"},
		{"handler = \"h\"\nkeep_response_bytes = -1", "downstreams.v.keep_response_bytes", "from 0"},
		{"handler = \"h\"\njob_methods = [\"TRACE\"]", "downstreams.v.job_methods[0]", "not a method"},
		{"handler = \"h\"\nburst = 2", "downstreams.v.burst", "goes with rate"},
	}
	for _, c := range cases {
		p := writeFile(t, "[downstreams.v]\n"+c.body+"\n")
		_, err := Load(p, nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Key != c.key || !strings.Contains(cerr.Reason, c.reason) {
			t.Errorf("%q: got %v; want key %s and %q", c.body, err, c.key, c.reason)
		}
	}
}

// CheckDownstream runs again on a handler downstream already checked (as
// outbound.Compile does at every load): nothing it filled is refused then.
func TestHandlerDownstreamCheckedTwice(t *testing.T) {
	t.Parallel()
	d := Downstream{Handler: "h", JobMethods: []string{"put"}}
	for i := range 2 {
		if err := CheckDownstream("v", &d); err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
	}
}
