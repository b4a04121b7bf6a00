package config

import (
	"cmp"
	"fmt"
	"mime"
	"net/url"
	"slices"
	"strings"

	"github.com/throttler-dev/throttler/internal/secret"
)

// The keys of DESIGN.md section 6a: how a downstream's request is shaped.
// Config stays data: secrets and TLS files are named here and read by
// internal/outbound's Compile (at start, at SIGHUP, by `config check`).

// Body kinds (Downstream.Body) and form array styles (FormArrays).
const (
	BodyJSON    = "json"
	BodyForm    = "form"
	BodyRaw     = "raw"
	FormRepeat  = "repeat"
	FormIndexed = "indexed"
)

// Defaults of the request keys.
const (
	DefaultMethod            = "POST"
	DefaultRawContentType    = "text/plain; charset=utf-8"
	DefaultIdempotencyHeader = "Idempotency-Key"
	DefaultKeepResponseBytes = 4096
	MaxKeepResponseBytes     = 1 << 20
)

// Methods are the HTTP methods a downstream or a job may use.
var Methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// Auth types (DownstreamAuth.Type).
const (
	AuthBasic  = "basic"
	AuthBearer = "bearer"
	AuthHeader = "header"
)

// DownstreamAuth is how the vendor knows us. The zero value is no auth.
// Secrets come only from *_env (an environment variable's name) or *_file
// (a file's path), exactly one of the pair the type needs.
type DownstreamAuth struct {
	// Type is "basic" (username and password), "bearer" (token) or
	// "header" (a header named name, holding value).
	Type         string `toml:"type"`
	Username     string `toml:"username"`
	PasswordEnv  string `toml:"password_env"`
	PasswordFile string `toml:"password_file"`
	TokenEnv     string `toml:"token_env"`
	TokenFile    string `toml:"token_file"`
	Name         string `toml:"name"`
	ValueEnv     string `toml:"value_env"`
	ValueFile    string `toml:"value_file"`

	// Password, Token and Value are only here to refuse a secret written
	// in the file, with a message that says what to write instead.
	Password InlineSecret `toml:"password,omitempty"`
	Token    InlineSecret `toml:"token,omitempty"`
	Value    InlineSecret `toml:"value,omitempty"`
}

// Secret is the secret the auth type needs: its name ("password",
// "token" or "value", which is also its keys' stem) and where it comes
// from. ok is false for no auth.
func (a DownstreamAuth) Secret() (what string, ref secret.Ref, ok bool) {
	switch a.Type {
	case AuthBasic:
		return "password", secret.Ref{Env: a.PasswordEnv, File: a.PasswordFile}, true
	case AuthBearer:
		return "token", secret.Ref{Env: a.TokenEnv, File: a.TokenFile}, true
	case AuthHeader:
		return "value", secret.Ref{Env: a.ValueEnv, File: a.ValueFile}, true
	}
	return "", secret.Ref{}, false
}

// InlineSecret records that the file wrote a secret where only its
// source may be named; the text itself is dropped at once, never kept.
type InlineSecret bool

// UnmarshalTOML notes the key and drops its value, whatever its type.
func (s *InlineSecret) UnmarshalTOML(any) error { *s = true; return nil }

// SigningRef is where the downstream's signing secrets come from (zero:
// requests are not signed).
func (d Downstream) SigningRef() secret.Ref {
	return secret.Ref{Env: d.SigningSecretEnv, File: d.SigningSecretFile}
}

// Idempotency is the name of the header that carries the job id ("":
// none).
func (d Downstream) Idempotency() string {
	if d.IdempotencyHeader == nil {
		return DefaultIdempotencyHeader
	}
	return *d.IdempotencyHeader
}

// KeepBytes is how much of an answer's body is kept, in bytes.
func (d Downstream) KeepBytes() int {
	if d.KeepResponseBytes == nil {
		return DefaultKeepResponseBytes
	}
	return *d.KeepResponseBytes
}

// ProtectedHeader reports whether name (any case) is throttler's: neither
// the static headers nor a job may set it. Auth's own header is among them.
func (d Downstream) ProtectedHeader(name string) bool { return d.headerOwner(name) != "" }

// headerOwner says why name is not for headers or a job ("": it is free).
func (d Downstream) headerOwner(name string) string {
	if why := reservedHeader(name); why != "" {
		return why
	}
	if slices.ContainsFunc([]string{"Authorization", "Cookie"}, func(s string) bool { return strings.EqualFold(s, name) }) {
		return "is a credential: set it with auth (its secret from an environment variable or a file)"
	}
	if d.Auth.Type == AuthHeader && strings.EqualFold(name, d.Auth.Name) {
		return "is auth's header"
	}
	if idem := d.Idempotency(); idem != "" && strings.EqualFold(name, idem) {
		return "is the idempotency header (idempotency_header), which carries the job id"
	}
	return ""
}

// reservedHeader says why name is throttler's whatever the auth ("": it
// is not): the framing net/http writes, the idempotency header and
// throttler's own names. Auth may use Authorization and Cookie, not these.
func reservedHeader(name string) string {
	lower := strings.ToLower(name)
	switch {
	case lower == "content-type":
		return "is set from body (and content_type for body = \"raw\")"
	case slices.Contains([]string{"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}, lower):
		return "is part of the HTTP framing, which throttler writes"
	case strings.HasPrefix(lower, "proxy-"):
		return "is for proxies (Proxy-*), which throttler does not let a downstream set"
	case strings.HasPrefix(lower, "x-throttler-"):
		return "is throttler's own (X-Throttler-*)"
	case strings.HasPrefix(lower, "webhook-"):
		return "belongs to the Standard Webhooks signature (webhook-*)"
	}
	return ""
}

// ValidHeaderName reports whether name is an HTTP field name (a token:
// letters, digits and !#$%&'*+-.^_`|~).
func ValidHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < '!' || c > '~' || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// ValidHeaderValue reports whether v can be sent as a field value: no
// control characters but tab (so no CR, LF or NUL), as net/http requires.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// CheckDownstream validates one downstream as Load does, filling its
// defaults, for a Downstream that did not come from a file.
func CheckDownstream(name string, d *Downstream) error {
	return (&Config{}).checkDownstream(name, d)
}

// checkOutbound checks the request keys of downstream key (url already
// parsed as u), filling Method, Body, FormArrays and ContentType.
func (c *Config) checkOutbound(key string, u *url.URL, d *Downstream) error {
	for _, step := range []func(string, *url.URL, *Downstream) error{
		c.checkShape, c.checkStaticHeaders, c.checkAuth, c.checkJobLists, c.checkTLSKeys, c.checkSigning, c.checkResponseKeys,
	} {
		if err := step(key, u, d); err != nil {
			return err
		}
	}
	return nil
}

// checkShape checks method and body keys, filling their defaults.
func (c *Config) checkShape(key string, _ *url.URL, d *Downstream) error {
	d.Method = strings.ToUpper(cmp.Or(d.Method, DefaultMethod))
	if !slices.Contains(Methods, d.Method) {
		return c.bad(key+".method", "%q is not a method: use GET, POST, PUT, PATCH or DELETE", d.Method)
	}
	switch d.Body = cmp.Or(d.Body, BodyJSON); d.Body {
	case BodyJSON, BodyForm, BodyRaw:
	default:
		return c.bad(key+".body", "%q is not a body kind: use \"json\", \"form\" or \"raw\"", d.Body)
	}
	if d.FormArrays != "" && d.Body != BodyForm {
		return c.bad(key+".form_arrays", "goes with body = \"form\": remove it, or set body = \"form\"")
	}
	if d.Body == BodyForm {
		d.FormArrays = cmp.Or(d.FormArrays, FormRepeat)
		if d.FormArrays != FormRepeat && d.FormArrays != FormIndexed {
			return c.bad(key+".form_arrays", "%q is not an array style: use \"repeat\" (k=a&k=b) or \"indexed\" (k[0]=a&k[1]=b)", d.FormArrays)
		}
	}
	if d.ContentType != "" && d.Body != BodyRaw {
		return c.bad(key+".content_type", "goes with body = \"raw\" (json and form set their own): remove it, or set body = \"raw\"")
	}
	if d.Body == BodyRaw {
		d.ContentType = cmp.Or(d.ContentType, DefaultRawContentType)
		if _, _, err := mime.ParseMediaType(d.ContentType); err != nil || !ValidHeaderValue(d.ContentType) {
			return c.bad(key+".content_type", "%q is not a media type such as \"text/xml; charset=utf-8\"", d.ContentType)
		}
	}
	if d.IdempotencyHeader != nil && *d.IdempotencyHeader != "" {
		name := *d.IdempotencyHeader
		if !ValidHeaderName(name) {
			return c.bad(key+".idempotency_header", "%q is not a header name (letters, digits and - only, say); \"\" sends none", name)
		}
		if why := reservedHeader(name); why != "" || strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Cookie") {
			return c.bad(key+".idempotency_header", "%q cannot carry the job id: it %s", name, cmp.Or(why, "is a credential"))
		}
	}
	return nil
}

// checkStaticHeaders checks headers: valid, and none of throttler's.
func (c *Config) checkStaticHeaders(key string, _ *url.URL, d *Downstream) error {
	seen := map[string]bool{}
	for _, name := range sortedKeys(d.Headers) {
		k := key + ".headers." + name
		if !ValidHeaderName(name) {
			return c.bad(k, "%q is not a header name", name)
		}
		if seen[strings.ToLower(name)] {
			return c.bad(k, "is given twice (header names are case-insensitive): keep one")
		}
		seen[strings.ToLower(name)] = true
		if why := d.headerOwner(name); why != "" {
			return c.bad(k, "%s %s: remove it from headers", name, why)
		}
		// The value is not echoed: it may be a credential in the wrong place.
		if !ValidHeaderValue(d.Headers[name]) {
			return c.bad(k, "the value holds a control character (CR, LF, NUL...): headers are one line of text")
		}
	}
	return nil
}

// secretPair refuses a pair of *_env / *_file keys that names both
// sources, or neither when required.
func (c *Config) secretPair(key string, r secret.Ref, required bool, why string) error {
	switch {
	case r.Env != "" && r.File != "":
		return c.bad(key+"_env", "set only one of %s_env and %s_file", key, key)
	case required && r.IsZero():
		return c.bad(key+"_env", "%s: name an environment variable with %s_env or a file with %s_file (a secret never sits in the config file)", why, key, key)
	}
	return nil
}

// inline refuses a secret written in the file.
func (c *Config) inline(key string) error {
	stem := key[strings.LastIndexByte(key, '.')+1:]
	return c.bad(key, "a secret never sits in the config file: name an environment variable with %s_env, or a file with %s_file", stem, stem)
}

// checkAuth checks auth: a known type with the one secret it needs, and
// no key of another type.
func (c *Config) checkAuth(key string, _ *url.URL, d *Downstream) error {
	a, k := d.Auth, key+".auth"
	for _, f := range []struct {
		name string
		set  InlineSecret
	}{{"password", a.Password}, {"token", a.Token}, {"value", a.Value}} {
		if f.set {
			return c.inline(k + "." + f.name)
		}
	}
	if a == (DownstreamAuth{}) {
		return nil
	}
	keys := map[string]string{ // key -> the type it goes with
		"username": AuthBasic, "password_env": AuthBasic, "password_file": AuthBasic,
		"token_env": AuthBearer, "token_file": AuthBearer,
		"name": AuthHeader, "value_env": AuthHeader, "value_file": AuthHeader,
	}
	given := map[string]string{
		"username": a.Username, "password_env": a.PasswordEnv, "password_file": a.PasswordFile,
		"token_env": a.TokenEnv, "token_file": a.TokenFile, "name": a.Name, "value_env": a.ValueEnv, "value_file": a.ValueFile,
	}
	if a.Type != AuthBasic && a.Type != AuthBearer && a.Type != AuthHeader {
		return c.bad(k+".type", "%q is not an auth type: use \"basic\" (username, password_env), \"bearer\" (token_env) or \"header\" (name, value_env)", a.Type)
	}
	for _, name := range sortedKeys(given) {
		if given[name] != "" && keys[name] != a.Type {
			return c.bad(k+"."+name, "goes with type = %q, not %q: remove it", keys[name], a.Type)
		}
	}
	what, ref, _ := a.Secret()
	if err := c.secretPair(k+"."+what, ref, true, fmt.Sprintf("type = %q needs its %s", a.Type, what)); err != nil {
		return err
	}
	switch a.Type {
	case AuthBasic:
		if a.Username == "" || strings.ContainsRune(a.Username, ':') || !ValidHeaderValue(a.Username) {
			return c.bad(k+".username", "type = \"basic\" needs a username, without ':' or control characters")
		}
	case AuthHeader:
		if !ValidHeaderName(a.Name) {
			return c.bad(k+".name", "%q is not a header name: name the header that carries the value, such as \"X-Api-Key\"", a.Name)
		}
		if why := reservedHeader(a.Name); why != "" || strings.EqualFold(a.Name, d.Idempotency()) {
			return c.bad(k+".name", "%q cannot carry the credential: it %s", a.Name, cmp.Or(why, "is the idempotency header"))
		}
	}
	return nil
}

// checkJobLists checks job_paths, job_methods and job_headers, writing
// methods in capitals.
func (c *Config) checkJobLists(key string, _ *url.URL, d *Downstream) error {
	for i, p := range d.JobPaths {
		if why := badPathPattern(p); why != "" {
			return c.bad(fmt.Sprintf("%s.job_paths[%d]", key, i), "%q %s", p, why)
		}
	}
	for i, m := range d.JobMethods {
		d.JobMethods[i] = strings.ToUpper(m)
		if !slices.Contains(Methods, d.JobMethods[i]) {
			return c.bad(fmt.Sprintf("%s.job_methods[%d]", key, i), "%q is not a method: use GET, POST, PUT, PATCH or DELETE", m)
		}
	}
	for i, h := range d.JobHeaders {
		k := fmt.Sprintf("%s.job_headers[%d]", key, i)
		if !ValidHeaderName(h) {
			return c.bad(k, "%q is not a header name", h)
		}
		if why := d.headerOwner(h); why != "" {
			return c.bad(k, "%s %s: a job may never set it", h, why)
		}
	}
	return nil
}

// badPathPattern says what is wrong with a job_paths pattern ("": fine).
// Patterns are plain (decoded) paths, matched against a job's decoded
// path: an exact path, or a prefix ending in "*".
func badPathPattern(p string) string {
	literal := strings.TrimSuffix(p, "*")
	switch {
	case !strings.HasPrefix(p, "/"):
		return "must be an absolute path, starting with /"
	case strings.Contains(literal, "*"):
		return "may hold * only at its end (a prefix)"
	case strings.ContainsAny(p, "?#%\\") || !ValidHeaderValue(p) || strings.ContainsAny(p, " \t"):
		return "must be a plain path: no ?, #, %, \\, spaces or control characters"
	}
	segs := strings.Split(literal[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i < len(segs)-1) {
			return "may not hold a ., .. or empty (//) segment"
		}
	}
	return ""
}

// checkTLSKeys checks the TLS keys' shape; the files are read by Compile.
func (c *Config) checkTLSKeys(key string, u *url.URL, d *Downstream) error {
	if (d.TLSCertFile == "") != (d.TLSKeyFile == "") {
		return c.bad(key+".tls_cert_file", "set both tls_cert_file and tls_key_file (a client certificate and its key), or neither")
	}
	if u.Scheme != "https" && (d.TLSCAFile != "" || d.TLSCertFile != "" || d.TLSServerName != "") {
		return c.bad(key+".url", "the tls_* keys need an https:// url")
	}
	if n := d.TLSServerName; n != "" && (strings.ContainsAny(n, "/:@ ") || !ValidHeaderValue(n)) {
		return c.bad(key+".tls_server_name", "%q is not a host name", n)
	}
	return nil
}

// checkSigning checks the signing secret's source; Compile reads it.
func (c *Config) checkSigning(key string, _ *url.URL, d *Downstream) error {
	if d.SigningSecret {
		return c.inline(key + ".signing_secret")
	}
	return c.secretPair(key+".signing_secret", d.SigningRef(), false, "")
}

// checkResponseKeys checks what is kept of each answer.
func (c *Config) checkResponseKeys(key string, _ *url.URL, d *Downstream) error {
	if n := d.KeepBytes(); n < 0 || n > MaxKeepResponseBytes {
		return c.bad(key+".keep_response_bytes", "must be from 0 to %d (bytes), got %d", MaxKeepResponseBytes, n)
	}
	for i, h := range d.KeepResponseHeaders {
		k := fmt.Sprintf("%s.keep_response_headers[%d]", key, i)
		if !ValidHeaderName(h) {
			return c.bad(k, "%q is not a header name", h)
		}
		lower := strings.ToLower(h)
		if lower == "set-cookie" || lower == "authorization" || lower == "cookie" || strings.HasPrefix(lower, "proxy-") {
			return c.bad(k, "%s may carry a credential, which is never kept on a job", h)
		}
	}
	return nil
}
