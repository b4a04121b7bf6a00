package secret

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const distinctive = "s3cr3t-Zq8vXw-9e4f"

// holder has a Value in every kind of field fmt and the encoders reach.
type holder struct {
	Name   string
	Token  Value
	Ptr    *Value
	hidden Value
	Nested struct{ Password Value }
}

func newHolder() holder {
	v := New(distinctive)
	h := holder{Name: "x", Token: v, Ptr: &v, hidden: v}
	h.Nested.Password = v
	return h
}

func TestValueRedactsEverywhere(t *testing.T) {
	t.Parallel()
	v := New(distinctive)
	h := newHolder()
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10s", "%T"} {
		outs = append(outs, fmt.Sprintf(verb, v), fmt.Sprintf(verb, h), fmt.Sprintf(verb, &h), fmt.Sprintf(verb, []Value{v}), fmt.Sprintf(verb, map[string]Value{"k": v}))
	}
	outs = append(outs, fmt.Sprint(v, h), fmt.Sprintln(v, &h), v.String(), v.GoString(), fmt.Errorf("wrap: %w", errors.New(fmt.Sprint(v))).Error())
	for _, handler := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(handler(&buf))
		log.Info("msg", "secret", v, "holder", h, "ptr", &h, slog.Any("any", v), slog.Group("g", "v", v))
		log.With("w", v).Info("with")
		outs = append(outs, buf.String())
	}
	for _, x := range []any{v, h, &h, []Value{v}, map[string]Value{"k": v}} {
		b, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, string(b))
	}
	txt, _ := v.MarshalText()
	bin, _ := v.MarshalBinary()
	outs = append(outs, string(txt), string(bin))
	for _, out := range outs {
		if strings.Contains(out, distinctive) {
			t.Errorf("secret leaked: %s", out)
		}
	}
	if got := fmt.Sprintf("%v|%s|%q", v, v, v); got != `[redacted]|[redacted]|"[redacted]"` {
		t.Errorf("redaction: %s", got)
	}
	if b, _ := json.Marshal(h); !strings.Contains(string(b), `"Token":"[redacted]"`) {
		t.Errorf("json: %s", b)
	}
	if v.Reveal() != distinctive {
		t.Error("Reveal")
	}
}

func TestZeroAndEqual(t *testing.T) {
	t.Parallel()
	var z Value
	if !z.IsZero() || z.Reveal() != "" || !New("").IsZero() || New("a").IsZero() {
		t.Error("zero")
	}
	if !New("a").Equal(New("a")) || New("a").Equal(New("b")) || !z.Equal(New("")) {
		t.Error("Equal")
	}
	if err := json.Unmarshal([]byte(`{"Token":"x"}`), &holder{}); err == nil {
		t.Error("a Value decoded from JSON")
	}
}

func writeSecret(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestResolveFile(t *testing.T) {
	t.Parallel()
	v, err := Resolve("downstreams.a.auth.token", Ref{File: writeSecret(t, "  "+distinctive+"\n\n")})
	if err != nil || v.Reveal() != distinctive {
		t.Fatalf("%v %q", err, v.Reveal())
	}
	empty := writeSecret(t, " \n")
	missing := filepath.Join(t.TempDir(), "nope")
	cases := []struct {
		ref       Ref
		key, want string
	}{
		{Ref{File: empty}, "k_file", empty + " is empty"},
		{Ref{File: missing}, "k_file", "cannot read: open " + missing},
		{Ref{File: t.TempDir()}, "k_file", "cannot read:"},
		{Ref{}, "k_env", "name the secret's environment variable with k_env, or its file with k_file"},
		{Ref{Env: "A", File: "b"}, "k_env", "set only one of k_env and k_file"},
	}
	for _, c := range cases {
		_, err := Resolve("k", c.ref)
		var se *Error
		if !errors.As(err, &se) || se.Key != c.key || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want key %s and %q", c.ref, err, c.key, c.want)
		}
	}
}

// Environment variables are process-wide: this test does not run in
// parallel with others.
func TestResolveEnv(t *testing.T) {
	t.Setenv("THROTTLER_SECRET_TEST", " "+distinctive+"\n")
	t.Setenv("THROTTLER_SECRET_EMPTY", "  ")
	v, err := Resolve("k", Ref{Env: "THROTTLER_SECRET_TEST"})
	if err != nil || v.Reveal() != distinctive {
		t.Fatalf("%v %q", err, v.Reveal())
	}
	for _, name := range []string{"THROTTLER_SECRET_EMPTY", "THROTTLER_SECRET_UNSET_XYZ"} {
		_, err := Resolve("downstreams.twilio.auth.password", Ref{Env: name})
		want := "downstreams.twilio.auth.password_env: environment variable " + name + " is not set or empty"
		if err == nil || err.Error() != want {
			t.Errorf("got %v, want %s", err, want)
		}
	}
}

// A file that holds a secret but is not what Resolve wants (a directory,
// unreadable) never has its contents in the error; nor does Describe.
func TestErrorsNeverHoldTheValue(t *testing.T) {
	t.Parallel()
	p := writeSecret(t, distinctive)
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	_, err := Resolve("k", Ref{File: p, Env: distinctive + "_NOT_A_VALUE"})
	if err == nil {
		t.Fatal("both sources accepted")
	}
	if _, err := Resolve("k", Ref{File: p}); err != nil && strings.Contains(err.Error(), distinctive) {
		t.Errorf("leak: %v", err)
	}
	for _, ok := range []bool{true, false} {
		if d := Describe("password", Ref{File: p}, ok); strings.Contains(d, distinctive) {
			t.Errorf("leak: %s", d)
		}
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		what string
		ref  Ref
		ok   bool
		want string
	}{
		{"password", Ref{Env: "TWILIO_AUTH_TOKEN"}, true, "password from $TWILIO_AUTH_TOKEN (set)"},
		{"password", Ref{Env: "TWILIO_AUTH_TOKEN"}, false, "password from $TWILIO_AUTH_TOKEN (not set or empty)"},
		{"", Ref{File: "/run/secrets/x"}, true, "from file /run/secrets/x (set)"},
		{"token", Ref{File: "/run/secrets/x"}, false, "token from file /run/secrets/x (not readable or empty)"},
		{"value", Ref{}, false, "value not configured"},
	} {
		if got := Describe(c.what, c.ref, c.ok); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}
