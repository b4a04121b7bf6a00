// Package outbound owns turning a downstream's config and a job into the
// vendor's request, and nothing else (DESIGN.md section 6a): Compile reads
// what a downstream's config only names (its secrets, its TLS files) and
// parses its allow-lists, once per config load; Check is the admission
// check of a job's payload and request; Build makes the *http.Request,
// purely (no clock, no I/O); Sign adds the Standard Webhooks signature at
// the send; Keep decides what of the answer is kept on the job. Sending,
// pacing and transports stay in internal/dispatch.
//
// Headers are set in one order, later ones overriding earlier ones:
// throttler's (Content-Type, User-Agent, the idempotency header,
// X-Throttler-Tenant, X-Throttler-Attempt), the downstream's static
// headers, auth, then the job's allowed headers; Sign adds the webhook-*
// ones. Names throttler owns (config.Downstream.ProtectedHeader) are never
// taken from the static headers or a job, so they win in any case.
//
// Errors name the config key or the part of the job, and never hold a
// secret's value.
package outbound

import (
	"encoding/base64"
	"errors"
	"net/textproto"
	"net/url"
	"slices"
	"sort"
	"sync"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/secret"
)

// UserAgent is sent on every request (a static header may override it).
const UserAgent = "throttler"

// Downstream is a downstream compiled for building requests: its secrets
// read, its TLS config made, its allow-lists canonical. It is immutable
// and safe for concurrent use; a reload compiles a new one. Secrets are
// held as secret.Value, so printing a Downstream shows none of them.
type Downstream struct {
	name, key string
	cfg       config.Downstream // validated; names secrets, holds none
	base      *url.URL
	url       string // base as a job without a request or path sends it

	staticHeaders [][2]string // canonical name, value; sorted by name
	authName      string      // header that auth sets ("": no auth)
	authValue     secret.Value
	idempotency   string // canonical; "" sends none

	jobMethods []string        // the downstream's method first
	jobHeaders map[string]bool // canonical names
	baseQuery  url.Values      // keys of the url's own query: not a job's

	tls    *tlsSetup
	keys   []secret.Value // signing keys, decoded
	macs   []*sync.Pool   // per key, *mac: an HMAC keyed once, reused
	keep   int
	keepHs []string // canonical
}

// Compile validates d as config.Load does, reads its secrets and TLS
// files, and parses its allow-lists. It runs at start, at every SIGHUP and
// for `config check`; its errors are *config.Error naming the key (such as
// "downstreams.bank.tls_cert_file") and never a secret's value.
func Compile(name string, d config.Downstream) (*Downstream, error) {
	// CheckDownstream fills defaults in place: work on copies of the
	// slices it rewrites, never the caller's config.
	d.JobMethods = slices.Clone(d.JobMethods)
	if err := config.CheckDownstream(name, &d); err != nil {
		return nil, err
	}
	if d.Handler != "" {
		return compileHandler(name, d), nil
	}
	base, err := url.Parse(d.URL)
	if err != nil { // CheckDownstream parsed it already
		return nil, &config.Error{Key: "downstreams." + name + ".url", Reason: err.Error()}
	}
	o := &Downstream{name: name, key: "downstreams." + name, cfg: d, base: base, keep: d.KeepBytes()}
	o.baseQuery = base.Query()
	o.url = noFragment(base)
	o.idempotency = textproto.CanonicalMIMEHeaderKey(d.Idempotency())
	for _, k := range sortedKeys(d.Headers) {
		o.staticHeaders = append(o.staticHeaders, [2]string{textproto.CanonicalMIMEHeaderKey(k), d.Headers[k]})
	}
	sort.SliceStable(o.staticHeaders, func(i, j int) bool { return o.staticHeaders[i][0] < o.staticHeaders[j][0] })
	if err := o.compileAuth(); err != nil {
		return nil, err
	}
	if o.tls, err = compileTLS(o.key, d); err != nil {
		return nil, err
	}
	if o.keys, err = compileSigning(o.key, d.SigningRef()); err != nil {
		return nil, err
	}
	o.macs = macPools(o.keys)
	o.jobMethods = []string{d.Method}
	for _, m := range d.JobMethods {
		if !slices.Contains(o.jobMethods, m) {
			o.jobMethods = append(o.jobMethods, m)
		}
	}
	o.jobHeaders = map[string]bool{}
	for _, h := range d.JobHeaders {
		o.jobHeaders[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	for _, h := range append([]string{"Content-Type", "Location", "Retry-After"}, d.KeepResponseHeaders...) {
		if h = textproto.CanonicalMIMEHeaderKey(h); !slices.Contains(o.keepHs, h) {
			o.keepHs = append(o.keepHs, h)
		}
	}
	return o, nil
}

// compileHandler compiles a downstream that is a Go handler (DESIGN.md
// section 6d): no request is built for it, but a job's request is checked
// against its job_* lists as for a url (the handler gets it), and Keep
// keeps what the handler returns. Its base is a placeholder that no
// request is ever sent to: a job's path is checked, never dialled.
func compileHandler(name string, d config.Downstream) *Downstream {
	o := &Downstream{name: name, key: "downstreams." + name, cfg: d, keep: d.KeepBytes(),
		base: &url.URL{Scheme: "handler", Host: name}, jobHeaders: map[string]bool{}}
	for _, m := range d.JobMethods {
		if !slices.Contains(o.jobMethods, m) {
			o.jobMethods = append(o.jobMethods, m)
		}
	}
	for _, h := range d.JobHeaders {
		o.jobHeaders[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	return o
}

// Handler is the name of the Go handler the downstream calls ("": it is
// an HTTP downstream).
func (o *Downstream) Handler() string { return o.cfg.Handler }

// compileAuth reads auth's secret and makes the header it sends.
func (o *Downstream) compileAuth() error {
	a := o.cfg.Auth
	what, ref, ok := a.Secret()
	if !ok {
		return nil
	}
	key := o.key + ".auth." + what
	v, err := secret.Resolve(key, ref)
	if err != nil {
		return configError(err)
	}
	if !config.ValidHeaderValue(v.Reveal()) {
		return &config.Error{Key: usedKey(key, ref), Reason: "the secret holds a line break or another control character: a header value is one line"}
	}
	switch a.Type {
	case config.AuthBasic:
		o.authName = "Authorization"
		o.authValue = secret.New("Basic " + base64.StdEncoding.EncodeToString([]byte(a.Username+":"+v.Reveal())))
	case config.AuthBearer:
		o.authName, o.authValue = "Authorization", secret.New("Bearer "+v.Reveal())
	case config.AuthHeader:
		o.authName, o.authValue = textproto.CanonicalMIMEHeaderKey(a.Name), v
	}
	return nil
}

// Name is the downstream's name.
func (o *Downstream) Name() string { return o.name }

// Config is the validated config it was compiled from (which names its
// secrets, never holds them).
func (o *Downstream) Config() config.Downstream { return o.cfg }

// Signs reports whether requests are signed (a signing secret is set).
func (o *Downstream) Signs() bool { return len(o.keys) > 0 }

// String names the downstream, so that printing one shows no secret.
func (o *Downstream) String() string { return "outbound.Downstream(" + o.name + ")" }

// usedKey is the *_env or *_file key that ref's source was named by.
func usedKey(key string, ref secret.Ref) string {
	if ref.Env != "" {
		return key + "_env"
	}
	return key + "_file"
}

// configError turns secret.Resolve's error into the config error callers
// handle for every refused config.
func configError(err error) error {
	var se *secret.Error
	if errors.As(err, &se) {
		return &config.Error{Key: se.Key, Reason: se.Reason}
	}
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
