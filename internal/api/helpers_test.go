package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/outbound"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

func timeMS(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

func urlPathEscape(s string) string { return url.PathEscape(s) }

// newAPIForFuzz is newAPI for a fuzz target (one store for all inputs).
func newAPIForFuzz(f *testing.F) (http.Handler, *bolt.Store) {
	cfg := loadConfig(f, "")
	dir, err := os.MkdirTemp("", "throttler-fuzz-")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	store := openStore(f, dir, cfg, bolt.Options{})
	return New(Options{Store: store, Config: func() *config.Config { return cfg }}), store
}

// newAPI is an API with the default config on its own store.
func newAPI(t *testing.T) (http.Handler, *bolt.Store) {
	t.Helper()
	return newAPIConfig(t, "", nil)
}

// newAPIConfig is an API on its own store with the config body (TOML over
// the defaults) and a clock that both read; opts change the store's
// options.
func newAPIConfig(t *testing.T, body string, clk clock.Clock, opts ...func(*bolt.Options)) (http.Handler, *bolt.Store) {
	t.Helper()
	cfg := loadConfig(t, body)
	o := bolt.Options{Clock: clk}
	for _, f := range opts {
		f(&o)
	}
	store := openStore(t, t.TempDir(), cfg, o)
	return New(Options{Store: store, Config: func() *config.Config { return cfg }, Clock: clk}), store
}

// loadConfig is the config body, TOML over the defaults ("": the defaults
// alone).
func loadConfig(t testing.TB, body string) *config.Config {
	t.Helper()
	file := ""
	if body != "" {
		file = filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// openStore opens a store in dir, with o and the policies of cfg's
// tenants, that closes when the test ends.
func openStore(t testing.TB, dir string, cfg *config.Config, o bolt.Options) *bolt.Store {
	t.Helper()
	store, err := openStoreIn(dir, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// openStoreIn is openStore for a caller that closes the store itself (one
// store per check of a property test, not one per test).
func openStoreIn(dir string, cfg *config.Config, o bolt.Options) (*bolt.Store, error) {
	o.Policy = func(name string) leaky.Policy { ts, _ := cfg.Tenant(name); return ts.Policy() }
	return bolt.Open(filepath.Join(dir, "t.db"), o)
}

// do sends one request to h and checks the request and the answer against
// openapi.json (so every test of this package checks the document). It
// returns the status, headers and the decoded JSON body.
func do(t testing.TB, h http.Handler, method, path, body string) (int, http.Header, map[string]any) {
	t.Helper()
	hdr := http.Header{}
	if body != "" {
		hdr.Set("Content-Type", "application/json")
	}
	return doHeader(t, h, method, path, body, hdr)
}

// doHeader is do with request headers.
func doHeader(t testing.TB, h http.Handler, method, path, body string, hdr http.Header) (int, http.Header, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header = hdr.Clone()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if err := checkExchange(method, path, body, hdr, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
		t.Errorf("openapi.json: %v", err)
	}
	var m map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	return rec.Code, rec.Header(), m
}

// apiDoc is openapi.json loaded, validated and routed, once.
var apiDoc = sync.OnceValues(func() (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openAPI)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("not a valid OpenAPI document: %w", err)
	}
	return doc, nil
})

var apiRouter = sync.OnceValues(func() (routers.Router, error) {
	doc, err := apiDoc()
	if err != nil {
		return nil, err
	}
	// The status page's HTML and script are text, like /metrics.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/javascript", openapi3filter.PlainBodyDecoder)
	return gorillamux.NewRouter(doc)
})

// filterOptions check a bearer token's form (which token is valid is the
// server's business, and the 401 it answers is checked like any answer);
// status codes the document does not list are errors.
var filterOptions = &openapi3filter.Options{
	IncludeResponseStatus: true,
	SkipSettingDefaults:   true,
	AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
		// The scheme's name is case-insensitive (RFC 9110, 11.1).
		scheme, _, _ := strings.Cut(in.RequestValidationInput.Request.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return fmt.Errorf("no bearer token")
		}
		return nil
	},
}

// checkExchange checks a request and the server's answer (status, header,
// body) against openapi.json: a request the document calls malformed must
// be refused with a 4xx; every answer must be one the document describes.
func checkExchange(method, path, body string, reqHeader http.Header, status int, header http.Header, respBody []byte) error {
	router, err := apiRouter()
	if err != nil {
		return err
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header = reqHeader.Clone()
	route, params, err := router.FindRoute(req)
	if err != nil {
		return unroutedAnswer(method, path, err, status, header, respBody)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: filterOptions}
	// Refused (4xx), or redirected by the mux (a path it cleans, such as
	// "/v1/tenants/..").
	if reqErr := openapi3filter.ValidateRequest(context.Background(), in); reqErr != nil && (status < 300 || status > 499) {
		return fmt.Errorf("%s %s: the document calls the request malformed (%v), yet the server answered %d", method, path, reqErr, status)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: header,
		Body: io.NopCloser(bytes.NewReader(respBody)), Options: filterOptions,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return fmt.Errorf("%s %s answered %d, not as documented: %v\nbody: %s", method, path, status, err, truncate(string(respBody), 400))
	}
	return nil
}

// unroutedAnswer checks the answer to a request no operation of the
// document matches, against the answers its description lists beside the
// operations: 401 for a request without a valid token (Unauthorized, with
// WWW-Authenticate: auth comes before routing), the router's redirect to
// a path's clean form (Redirect), 405 for a method no operation has
// (MethodNotAllowed, with Allow), 400 invalid_tenant for a tenant path
// with a dot or empty segment, and the catch-all 404 not_found (as the
// document's NotFound); {"error", "message"} like every error.
func unroutedAnswer(method, path string, routeErr error, status int, header http.Header, body []byte) error {
	switch status {
	case http.StatusUnauthorized:
		if header.Get("WWW-Authenticate") == "" {
			return fmt.Errorf("%s %s answered 401 without WWW-Authenticate", method, path)
		}
		return unroutedError(method, path, status, body, "Unauthorized")
	case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		if header.Get("Location") == "" {
			return fmt.Errorf("%s %s answered %d without Location", method, path, status)
		}
		return nil
	case http.StatusBadRequest:
		if !strings.HasPrefix(path, "/v1/tenants/") {
			return fmt.Errorf("%s %s is not in the document (%v), yet the server answered 400", method, path, routeErr)
		}
		return unroutedError(method, path, status, body, "BadRequest")
	case http.StatusMethodNotAllowed:
		if header.Get("Allow") == "" {
			return fmt.Errorf("%s %s answered 405 without Allow", method, path)
		}
		return unroutedError(method, path, status, body, "MethodNotAllowed")
	case http.StatusNotFound:
		return unroutedError(method, path, status, body, "NotFound")
	}
	return fmt.Errorf("%s %s is not in the document (%v), yet the server answered %d: document it", method, path, routeErr, status)
}

// unroutedError checks an error answer against the document's schema of
// that name.
func unroutedError(method, path string, status int, body []byte, schema string) error {
	doc, err := apiDoc()
	if err != nil {
		return err
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s %s answered %d without a JSON body: %v", method, path, status, err)
	}
	if err := doc.Components.Schemas[schema].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		return fmt.Errorf("%s %s answered %d, not as the document's %s: %v", method, path, status, schema, err)
	}
	return nil
}

// serve is a request's body alone, unchecked.
func serve(h http.Handler, method, path string) []byte {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Body.Bytes()
}

// compileDownstreams is cfg's downstreams' request rules by name, as the
// service compiles them.
func compileDownstreams(t testing.TB, cfg *config.Config) map[string]*outbound.Downstream {
	t.Helper()
	compiled := map[string]*outbound.Downstream{}
	for name, d := range cfg.Downstreams {
		o, err := outbound.Compile(name, d)
		if err != nil {
			t.Fatal(err)
		}
		compiled[name] = o
	}
	return compiled
}
