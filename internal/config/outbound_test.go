package config

import (
	"errors"
	"strings"
	"testing"
)

// ds is a config with one downstream "v" whose keys are body.
func ds(body string) string {
	return "[downstreams.v]\nurl = \"https://api.vendor.example/v1/x\"\n" + body
}

func TestOutboundKeysLoad(t *testing.T) {
	t.Parallel()
	p := writeFile(t, `
[downstreams.twilio]
url = "https://api.twilio.com/2010-04-01/Accounts/AC0123/Messages.json"
body = "form"
headers = { Accept = "application/json" }
auth = { type = "basic", username = "AC0123", password_env = "TWILIO_AUTH_TOKEN" }
keep_response_headers = ["X-Request-Id"]
[downstreams.stripe]
url = "https://api.stripe.com/v1/charges"
method = "post"
body = "form"
form_arrays = "indexed"
auth = { type = "bearer", token_file = "/run/secrets/stripe" }
idempotency_header = "Idempotency-Key"
job_paths = ["/v1/*", "/v2/exact"]
job_methods = ["post", "DELETE"]
job_headers = ["Stripe-Account"]
keep_response_bytes = 0
[downstreams.bank]
url = "https://bank.example/pay"
body = "raw"
content_type = "text/xml"
auth = { type = "header", name = "X-Api-Key", value_file = "/run/k" }
idempotency_header = ""
tls_ca_file = "/etc/ca.pem"
tls_cert_file = "/etc/c.pem"
tls_key_file = "/etc/c.key"
tls_server_name = "api.bank.example"
signing_secret_env = "HOOK_SECRET"
[downstreams.plain]
url = "http://127.0.0.1:9000/send"
[tenant_defaults]
downstream = "plain"
`)
	cfg, err := Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tw, st, bank, plain := cfg.Downstreams["twilio"], cfg.Downstreams["stripe"], cfg.Downstreams["bank"], cfg.Downstreams["plain"]
	if tw.Method != "POST" || tw.Body != BodyForm || tw.FormArrays != FormRepeat || tw.Idempotency() != "Idempotency-Key" || tw.KeepBytes() != 4096 {
		t.Errorf("twilio: %+v", tw)
	}
	if what, ref, ok := tw.Auth.Secret(); !ok || what != "password" || ref.Env != "TWILIO_AUTH_TOKEN" {
		t.Errorf("twilio auth: %s %+v", what, ref)
	}
	if st.Method != "POST" || st.JobMethods[0] != "POST" || st.FormArrays != FormIndexed || st.KeepBytes() != 0 {
		t.Errorf("stripe: %+v", st)
	}
	if bank.ContentType != "text/xml" || bank.Idempotency() != "" || bank.SigningRef().Env != "HOOK_SECRET" || !bank.ProtectedHeader("x-api-key") {
		t.Errorf("bank: %+v", bank)
	}
	// A downstream with only url is as it always was: POST of the JSON payload.
	if plain.Method != "POST" || plain.Body != BodyJSON || plain.ContentType != "" || plain.Idempotency() != "Idempotency-Key" || plain.Auth != (DownstreamAuth{}) {
		t.Errorf("plain: %+v", plain)
	}
}

func TestOutboundKeysRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body, key, reason string
	}{
		{`method = "TRACE"`, "downstreams.v.method", "GET, POST, PUT, PATCH or DELETE"},
		{`body = "xml"`, "downstreams.v.body", `"json", "form" or "raw"`},
		{`form_arrays = "indexed"`, "downstreams.v.form_arrays", `goes with body = "form"`},
		{"body = \"form\"\nform_arrays = \"brackets\"", "downstreams.v.form_arrays", `"repeat"`},
		{`content_type = "text/xml"`, "downstreams.v.content_type", `goes with body = "raw"`},
		{"body = \"raw\"\ncontent_type = \"not a type;;\"", "downstreams.v.content_type", "media type"},
		{`headers = { Authorization = "Bearer x" }`, "downstreams.v.headers.Authorization", "set it with auth"},
		{`headers = { "proxy-authorization" = "x" }`, "downstreams.v.headers.proxy-authorization", "Proxy-*"},
		{`headers = { Host = "x" }`, "downstreams.v.headers.Host", "framing"},
		{`headers = { "Content-Length" = "1" }`, "downstreams.v.headers.Content-Length", "framing"},
		{`headers = { "content-type" = "text/xml" }`, "downstreams.v.headers.content-type", "set from body"},
		{`headers = { "Transfer-Encoding" = "chunked" }`, "downstreams.v.headers.Transfer-Encoding", "framing"},
		{`headers = { Connection = "close" }`, "downstreams.v.headers.Connection", "framing"},
		{`headers = { Cookie = "a=b" }`, "downstreams.v.headers.Cookie", "credential"},
		{`headers = { "idempotency-key" = "x" }`, "downstreams.v.headers.idempotency-key", "idempotency header"},
		{"idempotency_header = \"X-Idem\"\nheaders = { \"X-IDEM\" = \"x\" }", "downstreams.v.headers.X-IDEM", "idempotency header"},
		{`headers = { "X-Throttler-Tenant" = "x" }`, "downstreams.v.headers.X-Throttler-Tenant", "throttler's own"},
		{`headers = { "Webhook-Signature" = "x" }`, "downstreams.v.headers.Webhook-Signature", "Standard Webhooks"},
		{`headers = { "X-A" = "1", "x-a" = "2" }`, "downstreams.v.headers.x-a", "twice"},
		{`headers = { "Bad Name" = "x" }`, "downstreams.v.headers.Bad Name", "not a header name"},
		{`headers = { "X-A" = "a\r\nX-B: b" }`, "downstreams.v.headers.X-A", "control character"},
		{`auth = { username = "u" }`, "downstreams.v.auth.type", "not an auth type"},
		{`auth = { type = "digest" }`, "downstreams.v.auth.type", "not an auth type"},
		{`auth = { type = "basic", username = "u" }`, "downstreams.v.auth.password_env", "needs its password"},
		{`auth = { type = "basic", password_env = "P" }`, "downstreams.v.auth.username", "needs a username"},
		{`auth = { type = "basic", username = "a:b", password_env = "P" }`, "downstreams.v.auth.username", "without ':'"},
		{`auth = { type = "basic", username = "u", password_env = "P", password_file = "/f" }`, "downstreams.v.auth.password_env", "only one of"},
		{`auth = { type = "basic", username = "u", token_env = "P" }`, "downstreams.v.auth.token_env", `goes with type = "bearer"`},
		{`auth = { type = "bearer" }`, "downstreams.v.auth.token_env", "token_file"},
		{`auth = { type = "header", value_env = "V" }`, "downstreams.v.auth.name", "not a header name"},
		{`auth = { type = "header", name = "Content-Type", value_env = "V" }`, "downstreams.v.auth.name", "cannot carry"},
		{`auth = { type = "header", name = "Idempotency-Key", value_env = "V" }`, "downstreams.v.auth.name", "idempotency header"},
		{"auth = { type = \"header\", name = \"X-Key\", value_env = \"V\" }\nheaders = { \"x-key\" = \"1\" }", "downstreams.v.headers.x-key", "auth's header"},
		{`idempotency_header = "Content-Length"`, "downstreams.v.idempotency_header", "cannot carry"},
		{`idempotency_header = "Idem Key"`, "downstreams.v.idempotency_header", "not a header name"},
		{`job_paths = ["v1/*"]`, "downstreams.v.job_paths[0]", "absolute"},
		{`job_paths = ["/v1/*", "/*/x"]`, "downstreams.v.job_paths[1]", "only at its end"},
		{`job_paths = ["/v1/../admin"]`, "downstreams.v.job_paths[0]", "segment"},
		{`job_paths = ["/v1//x"]`, "downstreams.v.job_paths[0]", "segment"},
		{`job_paths = ["/v1/%2e%2e/x"]`, "downstreams.v.job_paths[0]", "plain path"},
		{`job_paths = ["/v1?x=1"]`, "downstreams.v.job_paths[0]", "plain path"},
		{`job_methods = ["POST", "CONNECT"]`, "downstreams.v.job_methods[1]", "not a method"},
		{`job_headers = ["Stripe-Account", "authorization"]`, "downstreams.v.job_headers[1]", "never set it"},
		{`job_headers = ["X-Throttler-Attempt"]`, "downstreams.v.job_headers[0]", "never set it"},
		{`job_headers = ["Idempotency-Key"]`, "downstreams.v.job_headers[0]", "idempotency header"},
		{`tls_cert_file = "/c.pem"`, "downstreams.v.tls_cert_file", "both"},
		{`tls_key_file = "/c.key"`, "downstreams.v.tls_cert_file", "both"},
		{`tls_server_name = "a b"`, "downstreams.v.tls_server_name", "not a host name"},
		{"signing_secret_env = \"A\"\nsigning_secret_file = \"/b\"", "downstreams.v.signing_secret_env", "only one of"},
		{`keep_response_bytes = -1`, "downstreams.v.keep_response_bytes", "from 0 to 1048576"},
		{`keep_response_bytes = 1048577`, "downstreams.v.keep_response_bytes", "from 0 to 1048576"},
		{`keep_response_headers = ["Set-Cookie"]`, "downstreams.v.keep_response_headers[0]", "credential"},
		{`keep_response_headers = ["a b"]`, "downstreams.v.keep_response_headers[0]", "not a header name"},
	}
	for _, c := range cases {
		p := writeFile(t, ds(c.body))
		_, err := Load(p, nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Key != c.key || !strings.Contains(cerr.Reason, c.reason) {
			t.Errorf("%s: got %v; want key %s and %q", c.body, err, c.key, c.reason)
		}
	}
	p := writeFile(t, "[downstreams.v]\nurl = \"http://x/\"\ntls_ca_file = \"/ca.pem\"\n")
	if _, err := Load(p, nil, nil); err == nil || !strings.Contains(err.Error(), "downstreams.v.url: the tls_* keys need an https:// url") {
		t.Errorf("tls on http: %v", err)
	}
}

// A secret written in the file is refused, saying what to write instead,
// and the refusal never repeats it.
func TestInlineSecretsRefused(t *testing.T) {
	t.Parallel()
	const value = "sk_live_Distinctive42"
	cases := []struct{ body, key, fix string }{
		{`auth = { type = "basic", username = "u", password = "` + value + `" }`, "downstreams.v.auth.password", "password_env"},
		{`auth = { type = "bearer", token = "` + value + `" }`, "downstreams.v.auth.token", "token_file"},
		{`auth = { type = "header", name = "X-K", value = "` + value + `" }`, "downstreams.v.auth.value", "value_env"},
		{`auth = { type = "bearer", token = 42 }`, "downstreams.v.auth.token", "token_env"},
		{`signing_secret = "whsec_` + value + `"`, "downstreams.v.signing_secret", "signing_secret_file"},
		{`headers = { "X-Api-Key" = "` + value + `\u0001" }`, "downstreams.v.headers.X-Api-Key", "control character"},
		{`headers = { Authorization = "Bearer ` + value + `" }`, "downstreams.v.headers.Authorization", "auth"},
	}
	for _, c := range cases {
		_, err := Load(writeFile(t, ds(c.body)), nil, nil)
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Key != c.key || !strings.Contains(cerr.Reason, c.fix) {
			t.Errorf("%s: got %v; want key %s and %q", c.body, err, c.key, c.fix)
		}
		if err != nil && strings.Contains(err.Error(), value) {
			t.Errorf("the refusal repeats the secret: %v", err)
		}
	}
}

func TestCheckDownstreamWithoutAFile(t *testing.T) {
	t.Parallel()
	d := Downstream{URL: "https://x.example/", Body: "form"}
	if err := CheckDownstream("x", &d); err != nil || d.Method != "POST" || d.FormArrays != FormRepeat || d.MaxAttempts != 5 {
		t.Fatalf("%v %+v", err, d)
	}
	bad := Downstream{URL: "https://x.example/", Method: "BREW"}
	if err := CheckDownstream("x", &bad); err == nil || err.Error() != `config: downstreams.x.method: "BREW" is not a method: use GET, POST, PUT, PATCH or DELETE` {
		t.Fatalf("%v", err)
	}
}

func TestHeaderRules(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"X-Api-Key", "Stripe-Account", "a", "x_y.z~!#$%&'*+^`|"} {
		if !ValidHeaderName(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "a b", "a:b", "a\r", "é", "a(b)", "a/b"} {
		if ValidHeaderName(bad) {
			t.Errorf("%q allowed", bad)
		}
	}
	for v, want := range map[string]bool{"a\tb": true, "ünï": true, "": true, "a\rb": false, "a\nb": false, "a\x00": false, "\x7f": false} {
		if ValidHeaderValue(v) != want {
			t.Errorf("ValidHeaderValue(%q) != %v", v, want)
		}
	}
	idem := ""
	d := Downstream{IdempotencyHeader: &idem}
	for name, want := range map[string]bool{
		"authorization": true, "PROXY-AUTHORIZATION": true, "proxy-x": true, "Host": true, "content-length": true,
		"Content-Type": true, "transfer-encoding": true, "Connection": true, "Cookie": true, "x-throttler-anything": true,
		"webhook-id": true, "Idempotency-Key": false, "Stripe-Account": false, "User-Agent": false,
	} {
		if d.ProtectedHeader(name) != want {
			t.Errorf("ProtectedHeader(%q) != %v", name, want)
		}
	}
	if !(Downstream{}).ProtectedHeader("idempotency-key") {
		t.Error("the default idempotency header is not protected")
	}
}
