package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/secret"
)

// No error, description or printing of a compiled downstream holds a
// secret's value.
func TestSecretsNeverShow(t *testing.T) {
	t.Parallel()
	const distinctive = "Zx9-distinctive-SECRET-q7"
	var outs []string
	// Secrets that cannot be used: a line break in a header value, a
	// signing secret that is not base64.
	for _, d := range []config.Downstream{
		{URL: "https://x.example/", Auth: config.DownstreamAuth{Type: "bearer", TokenFile: secretFile(t, distinctive+"\n"+distinctive)}},
		{URL: "https://x.example/", Auth: config.DownstreamAuth{Type: "header", Name: "X-K", ValueFile: secretFile(t, distinctive+"\x00")}},
		{URL: "https://x.example/", SigningSecretFile: secretFile(t, "whsec_"+distinctive)},
		{URL: "https://x.example/", TLSCAFile: secretFile(t, distinctive)},
		{URL: "https://x.example/", TLSCertFile: secretFile(t, distinctive), TLSKeyFile: secretFile(t, distinctive)},
	} {
		_, err := Compile("v", d)
		if err == nil {
			t.Fatalf("%+v compiled", d)
		}
		outs = append(outs, err.Error(), fmt.Sprintf("%+v", err))
	}
	for _, ok := range []bool{true, false} {
		outs = append(outs, secret.Describe("password", secret.Ref{File: secretFile(t, distinctive)}, ok))
	}
	// A downstream that holds every kind of secret, printed and logged.
	o := compile(t, config.Downstream{
		URL:               "https://x.example/",
		Auth:              config.DownstreamAuth{Type: "basic", Username: "u", PasswordFile: secretFile(t, distinctive)},
		SigningSecretFile: secretFile(t, "whsec_"+"WnByaXZhdGUta2V5LWJ5dGVz"),
		JobHeaders:        []string{"X-Ok"},
	})
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("d", "d", o, "v", *o)
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("d", "d", o)
	js, _ := json.Marshal(o)
	outs = append(outs, fmt.Sprintf("%v %+v %#v %s", o, o, o, o), fmt.Sprintf("%+v %#v", *o, *o), buf.String(), string(js))
	for _, out := range outs {
		if strings.Contains(out, distinctive) || strings.Contains(out, "WnByaXZhdGUta2V5LWJ5dGVz") || strings.Contains(out, "private-key-bytes") {
			t.Errorf("a secret shows: %s", out)
		}
	}
	// A job's header values are not echoed either.
	o = compile(t, config.Downstream{URL: "https://x.example/", JobHeaders: []string{"X-Ok"}})
	_, _, err := o.Build(context.Background(), BuildJob{Request: &JobRequest{Headers: map[string]string{"X-Ok": distinctive + "\n"}}})
	var na *NotAllowedError
	if !errors.As(err, &na) || strings.Contains(err.Error(), distinctive) {
		t.Errorf("%v", err)
	}
}

// Environment variables are process-wide: this test does not run in
// parallel.
func TestAuthFromEnv(t *testing.T) {
	t.Setenv("THROTTLER_OUTBOUND_TEST_TOKEN", twilioToken+"\n")
	d := config.Downstream{URL: "https://api.twilio.com/x", Auth: config.DownstreamAuth{Type: "basic", Username: "AC0123", PasswordEnv: "THROTTLER_OUTBOUND_TEST_TOKEN"}}
	req, _, err := compile(t, d).Build(context.Background(), BuildJob{ID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if u, p, ok := req.BasicAuth(); !ok || u != "AC0123" || p != twilioToken {
		t.Errorf("basic auth %q %q", u, p)
	}
	d.Auth.PasswordEnv = "THROTTLER_OUTBOUND_TEST_UNSET"
	_, err = Compile("twilio", d)
	if err == nil || err.Error() != "config: downstreams.twilio.auth.password_env: environment variable THROTTLER_OUTBOUND_TEST_UNSET is not set or empty" {
		t.Errorf("%v", err)
	}
}
