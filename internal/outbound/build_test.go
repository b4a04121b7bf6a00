package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

type golden struct {
	name string
	d    func(t *testing.T) config.Downstream
	job  BuildJob
	sign time.Time // zero: not signed
}

func goldenCases() []golden {
	job := func(payload string, r *JobRequest) BuildJob {
		return BuildJob{ID: "01JOBID", Tenant: "acme", Attempt: 2, Payload: json.RawMessage(payload), Request: r}
	}
	return []golden{
		{name: "default", d: func(*testing.T) config.Downstream {
			return config.Downstream{URL: "http://127.0.0.1:9000/send"}
		}, job: job(`{"to": "+15551234567", "text": "hi"}`, nil)},
		{name: "twilio", d: func(t *testing.T) config.Downstream {
			return config.Downstream{
				URL:     "https://api.twilio.com/2010-04-01/Accounts/AC0123/Messages.json",
				Body:    "form",
				Headers: map[string]string{"Accept": "application/json"},
				Auth:    config.DownstreamAuth{Type: "basic", Username: "AC0123", PasswordFile: secretFile(t, twilioToken)},
			}
		}, job: job(`{"To": "+15551234567", "From": "+15557654321", "Body": "Hello & welcome ✓ 100%",
			"MediaUrl": ["https://a.example/1.png", "https://a.example/2.png?x=1&y=2"], "StatusCallback": null}`, nil)},
		{name: "stripe", d: func(t *testing.T) config.Downstream {
			return config.Downstream{
				URL:        "https://api.stripe.com/v1/charges",
				Body:       "form",
				Auth:       config.DownstreamAuth{Type: "bearer", TokenFile: secretFile(t, stripeKey)},
				JobPaths:   []string{"/v1/*"},
				JobMethods: []string{"POST", "DELETE"},
				JobHeaders: []string{"Stripe-Account"},
			}
		}, job: job(`{"charge": "ch_1", "amount": 1050, "reverse_transfer": true, "metadata": {"order_id": "6735", "note": null},
			"items": [{"price": "price_1", "quantity": 2}, {"price": "price_2"}], "expand[]": ["charge", "customer"]}`,
			&JobRequest{Path: "/v1/refunds", Query: Query{"expand[]": {"balance_transaction"}}, Headers: map[string]string{"stripe-account": "acct_1"}})},
		{name: "raw-xml", d: func(*testing.T) config.Downstream {
			return config.Downstream{URL: "https://soap.vendor.example/service", Body: "raw", ContentType: "text/xml; charset=utf-8", Method: "PUT"}
		}, job: job(`"<?xml version=\"1.0\"?>\n<Send><To>+15551234567</To><Text>Grüße &amp; hi</Text></Send>"`, nil)},
		{name: "get-query", d: func(*testing.T) config.Downstream {
			return config.Downstream{URL: "https://api.vendor.example/v2/status?account=A", Method: "GET", JobPaths: []string{"/v2/items/*"}}
		}, job: job(`null`, &JobRequest{Path: "/v2/items/a%20b/c", Query: Query{"q": {"x y", "z&w"}, "page": {"2"}}})},
		{name: "header-auth", d: func(t *testing.T) config.Downstream {
			return config.Downstream{
				URL:     "https://api.vendor.example/send",
				Auth:    config.DownstreamAuth{Type: "header", Name: "x-api-key", ValueFile: secretFile(t, vendorKey)},
				Headers: map[string]string{"Accept": "application/json", "User-Agent": "acme-app/1.0"},
			}
		}, job: job(`{"a": [1, 2.50, "x"]}`, nil)},
		{name: "no-idempotency-header", d: func(*testing.T) config.Downstream {
			return config.Downstream{URL: "https://api.vendor.example/send", IdempotencyHeader: ptr("")}
		}, job: job(`{"a": 1}`, nil)},
		{name: "signed", d: func(t *testing.T) config.Downstream {
			return config.Downstream{URL: "https://hooks.internal.example/in", IdempotencyHeader: ptr("X-Idempotency-Key"), SigningSecretFile: secretFile(t, hookSecret)}
		}, job: job(`{"test": 2432232314}`, nil), sign: time.Unix(1614265330, 0)},
	}
}

// Each request as it goes on the wire, against testdata/golden (go test
// -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := compile(t, c.d(t))
			if err := o.Check(c.job.Payload, c.job.Request); err != nil {
				t.Fatalf("Check: %v", err)
			}
			req, body, err := o.Build(context.Background(), c.job)
			if err != nil {
				t.Fatal(err)
			}
			if !c.sign.IsZero() {
				o.Sign(req.Header, c.job.ID, body, c.sign)
			}
			dump, err := httputil.DumpRequestOut(req, true)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.ReplaceAll(string(dump), "\r\n", "\n")
			path := filepath.Join("testdata", "golden", c.name+".txt")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

// The forms as a server reads them, by url.ParseQuery: not by the encoder.
func TestBuiltFormsParse(t *testing.T) {
	t.Parallel()
	want := map[string]url.Values{
		"twilio": {
			"To": {"+15551234567"}, "From": {"+15557654321"}, "Body": {"Hello & welcome ✓ 100%"},
			"MediaUrl": {"https://a.example/1.png", "https://a.example/2.png?x=1&y=2"},
		},
		"stripe": {
			"charge": {"ch_1"}, "amount": {"1050"}, "reverse_transfer": {"true"}, "metadata[order_id]": {"6735"},
			"items[0][price]": {"price_1"}, "items[0][quantity]": {"2"}, "items[1][price]": {"price_2"},
			"expand[]": {"charge", "customer"},
		},
	}
	for _, c := range goldenCases() {
		if want[c.name] == nil {
			continue
		}
		_, body, err := compile(t, c.d(t)).Build(context.Background(), c.job)
		if err != nil {
			t.Fatal(err)
		}
		got, err := url.ParseQuery(string(body))
		if err != nil || !reflect.DeepEqual(got, want[c.name]) {
			t.Errorf("%s: %v\n got %v\nwant %v", c.name, err, got, want[c.name])
		}
	}
}

// The default downstream sends what throttler always sent: a POST of the
// payload as it came, with the same five headers.
func TestDefaultRequestUnchanged(t *testing.T) {
	t.Parallel()
	o := compile(t, config.Downstream{URL: "http://127.0.0.1:9000/send?x=1"})
	payload := json.RawMessage(" {\"b\":1, \"a\" : [true]}\n")
	req, body, err := o.Build(context.Background(), BuildJob{ID: "id1", Tenant: "t", Attempt: 1, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != "POST" || req.URL.String() != "http://127.0.0.1:9000/send?x=1" || !bytes.Equal(body, payload) {
		t.Fatalf("%s %s %q", req.Method, req.URL, body)
	}
	want := map[string]string{"Content-Type": "application/json", "User-Agent": "throttler", "Idempotency-Key": "id1", "X-Throttler-Tenant": "t", "X-Throttler-Attempt": "1"}
	if len(req.Header) != len(want) {
		t.Errorf("headers: %v", req.Header)
	}
	for k, v := range want {
		if req.Header.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, req.Header.Get(k), v)
		}
	}
	// An empty payload is an empty body, as before.
	req, body, err = o.Build(context.Background(), BuildJob{ID: "id1"})
	if err != nil || len(body) != 0 || req.ContentLength != 0 {
		t.Fatalf("%v %q %d", err, body, req.ContentLength)
	}
}

// A job's method applies; GET and DELETE carry no body or Content-Type.
func TestJobMethodAndBodylessRequests(t *testing.T) {
	t.Parallel()
	o := compile(t, config.Downstream{URL: "https://api.stripe.com/v1/charges", Body: "form", JobMethods: []string{"delete"}, JobPaths: []string{"/v1/charges/*"}})
	req, body, err := o.Build(context.Background(), BuildJob{ID: "x", Request: &JobRequest{Method: "delete", Path: "/v1/charges/ch_1"}, Payload: json.RawMessage("null")})
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != "DELETE" || req.Body != nil || body != nil || req.Header.Get("Content-Type") != "" || req.URL.Path != "/v1/charges/ch_1" {
		t.Fatalf("%s %v %q %v", req.Method, req.Body, body, req.Header)
	}
	// The downstream's own method may always be asked for by name.
	if err := o.Check(nil, &JobRequest{Method: "POST"}); err != nil {
		t.Fatal(err)
	}
}

func TestJobRequestJSON(t *testing.T) {
	t.Parallel()
	var r JobRequest
	err := json.Unmarshal([]byte(`{"method": "POST", "path": "/v1/refunds", "query": {"expand[]": "charge", "id": ["a", "b"], "none": null}, "headers": {"Stripe-Account": "acct_1"}}`), &r)
	if err != nil {
		t.Fatal(err)
	}
	want := JobRequest{Method: "POST", Path: "/v1/refunds", Query: Query{"expand[]": {"charge"}, "id": {"a", "b"}}, Headers: map[string]string{"Stripe-Account": "acct_1"}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("got %+v\nwant %+v", r, want)
	}
	for _, bad := range []string{`{"query": {"a": 1}}`, `{"query": {"a": [1]}}`, `{"query": ["a"]}`, `{"query": {"a": {"b": "c"}}}`} {
		if err := json.Unmarshal([]byte(bad), &JobRequest{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	b, _ := json.Marshal(want)
	var back JobRequest
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, want) {
		t.Errorf("round trip: %s %+v %v", b, back, err)
	}
}

// A job without a request takes Build's short way (no job_* checks, the
// url made at Compile): it gives what the full plan gives for the same
// request spelt out, fragment dropped, and still refuses a body the
// downstream's method cannot carry.
func TestBuildWithoutRequestAsSpeltOut(t *testing.T) {
	t.Parallel()
	cases := append(goldenCases(), golden{name: "fragment", d: func(*testing.T) config.Downstream {
		return config.Downstream{URL: "https://x.example/a%20b/c?k=v#frag", Body: "form"}
	}, job: BuildJob{ID: "j", Tenant: "t", Attempt: 3, Payload: json.RawMessage(`{"a": ["1", "2"]}`)}})
	for _, c := range cases {
		if c.job.Request != nil {
			continue
		}
		o := compile(t, c.d(t))
		short, sbody, err := o.Build(context.Background(), c.job)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		spelt := c.job
		spelt.Request = &JobRequest{Method: o.Config().Method}
		long, lbody, err := o.Build(context.Background(), spelt)
		if err != nil || short.Method != long.Method || short.URL.String() != long.URL.String() ||
			!reflect.DeepEqual(short.Header, long.Header) || !bytes.Equal(sbody, lbody) || (sbody == nil) != (lbody == nil) {
			t.Errorf("%s: %s %s %v %q, spelt out %s %s %v %q %v", c.name, short.Method, short.URL, short.Header, sbody, long.Method, long.URL, long.Header, lbody, err)
		}
	}
	o := compile(t, config.Downstream{URL: "https://x.example/", Method: "GET"})
	var na *NotAllowedError
	if _, _, err := o.Build(context.Background(), BuildJob{Payload: json.RawMessage(`{"a": 1}`)}); !errors.As(err, &na) || na.Code != CodePayloadNotEncodable {
		t.Errorf("a body on the downstream's GET: %v", err)
	}
}
