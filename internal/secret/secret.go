// Package secret owns the secrets throttler reads: where one comes from (a
// Ref: an environment variable or a file named by a `*_env` or `*_file`
// config key), reading it (Resolve), and the Value that holds it once read.
// A Value redacts itself in every way Go prints or encodes a value (fmt,
// log/slog, encoding/json, encoding.TextMarshaler); Reveal is the one way to
// its text, so a secret reaches only the request that needs it. Errors and
// descriptions name the key and the variable or file, never the value.
package secret

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Redacted is what a Value prints as, whatever the verb or encoder.
const Redacted = "[redacted]"

// Ref says where a secret comes from: the name of an environment variable
// (Env) or the path of a file (File). Exactly one is set in a usable Ref.
type Ref struct {
	Env  string
	File string
}

// IsZero reports whether r names no source at all.
func (r Ref) IsZero() bool { return r.Env == "" && r.File == "" }

// Value is a secret once read. The zero Value is empty. The text sits
// behind a pointer so that even fmt's reflection over a struct that holds
// a Value in an unexported field prints an address, not the text.
type Value struct{ p *string }

// New wraps s; for tests and for values derived from a secret (a Basic
// authorization header built from a password is as secret as the password).
func New(s string) Value {
	if s == "" {
		return Value{}
	}
	return Value{p: &s}
}

// Reveal is the secret's text: the only way to read it.
func (v Value) Reveal() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

// IsZero reports whether v is empty.
func (v Value) IsZero() bool { return v.p == nil || *v.p == "" }

// Equal compares two secrets in constant time (for a reload that keeps
// what did not change).
func (v Value) Equal(o Value) bool {
	return subtle.ConstantTimeCompare([]byte(v.Reveal()), []byte(o.Reveal())) == 1
}

func (Value) String() string   { return Redacted }
func (Value) GoString() string { return Redacted }

// Format redacts v under every verb: %v %+v %#v %s %q %x and the rest.
func (Value) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		fmt.Fprint(f, strconv.Quote(Redacted))
		return
	}
	fmt.Fprint(f, Redacted)
}

func (Value) LogValue() slog.Value           { return slog.StringValue(Redacted) }
func (Value) MarshalJSON() ([]byte, error)   { return []byte(strconv.Quote(Redacted)), nil }
func (Value) MarshalText() ([]byte, error)   { return []byte(Redacted), nil }
func (Value) MarshalBinary() ([]byte, error) { return []byte(Redacted), nil }

// UnmarshalText refuses: a secret never comes from a decoded document (a
// config file, a request), only from Resolve.
func (*Value) UnmarshalText([]byte) error {
	return fmt.Errorf("a secret is never written out: name an environment variable (*_env) or a file (*_file)")
}

// Error is a secret that could not be read: the config key (such as
// "downstreams.twilio.auth.password_env") and why, never the value.
type Error struct {
	Key    string
	Reason string
}

func (e *Error) Error() string { return e.Key + ": " + e.Reason }

// Resolve reads the secret r names. key is the config key without its
// suffix ("downstreams.twilio.auth.password"): errors name key+"_env" or
// key+"_file". An environment variable's value and a file's contents are
// trimmed of surrounding white space (a file's trailing newline); a
// secret that is then empty is an error, as is a Ref that names both
// sources or neither.
func Resolve(key string, r Ref) (Value, error) {
	envKey, fileKey := key+"_env", key+"_file"
	switch {
	case r.Env != "" && r.File != "":
		return Value{}, &Error{Key: envKey, Reason: "set only one of " + envKey + " and " + fileKey}
	case r.Env != "":
		v := strings.TrimSpace(os.Getenv(r.Env))
		if v == "" {
			return Value{}, &Error{Key: envKey, Reason: "environment variable " + r.Env + " is not set or empty"}
		}
		return New(v), nil
	case r.File != "":
		raw, err := os.ReadFile(r.File)
		if err != nil {
			// An *os.PathError names the path and the cause, never contents.
			return Value{}, &Error{Key: fileKey, Reason: "cannot read: " + err.Error()}
		}
		v := strings.TrimSpace(string(raw))
		if v == "" {
			return Value{}, &Error{Key: fileKey, Reason: r.File + " is empty"}
		}
		return New(v), nil
	}
	return Value{}, &Error{Key: envKey, Reason: "name the secret's environment variable with " + envKey + ", or its file with " + fileKey}
}

// Describe says where a secret comes from and whether it could be read
// (ok), for `config check`: "password from $TWILIO_AUTH_TOKEN (set)",
// "token from file /run/secrets/stripe (not readable or empty)". what
// names the secret ("password"); "" leaves it out.
func Describe(what string, r Ref, ok bool) string {
	var s string
	switch {
	case r.Env != "" && r.File != "":
		s = "from both $" + r.Env + " and file " + r.File + " (give one)"
	case r.Env != "":
		s = "from $" + r.Env + state(ok, " (set)", " (not set or empty)")
	case r.File != "":
		s = "from file " + r.File + state(ok, " (set)", " (not readable or empty)")
	default:
		s = "not configured"
	}
	if what == "" {
		return s
	}
	return what + " " + s
}

func state(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}
