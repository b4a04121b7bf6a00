package api

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// The auth scheme is case-insensitive (RFC 9110, 11.1): "bearer" and
// "BEARER" are "Bearer", and more than one space may follow it.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	t.Parallel()
	h := newTour(t)
	for _, v := range []string{"Bearer acme-token", "bearer acme-token", "BEARER acme-token", "bEaReR  acme-token"} {
		st, _, body := doHeader(t, h, "GET", "/v1/tenants/acme", "", http.Header{"Authorization": {v}})
		if st != http.StatusOK {
			t.Errorf("Authorization: %s: %d %v, want 200", v, st, body)
		}
	}
	for _, v := range []string{"Basic acme-token", "Bearer", "Bearer ", "bearer wrong", "Bearer-acme-token", "acme-token"} {
		st, hdr, body := doHeader(t, h, "GET", "/v1/tenants/acme", "", http.Header{"Authorization": {v}})
		if st != http.StatusUnauthorized || body["error"] != "unauthorized" || hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization: %s: %d %v, want 401 unauthorized with WWW-Authenticate", v, st, body)
		}
	}
}

// Every path of the document answers a method it does not list with 405
// method_not_allowed and an Allow header listing the methods it does
// (RFC 9110, 15.5.6), on the API's routes, the health endpoints, the
// metrics and the status page's files alike: never a 404 that says the
// path does not exist.
func TestWrongMethodIsAnsweredWithAllow(t *testing.T) {
	t.Parallel()
	h := newTour(t)
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	paths := 0
	for path, item := range doc.Paths.Map() {
		var allowed []string
		for method := range item.Operations() {
			allowed = append(allowed, method)
			if method == http.MethodGet {
				allowed = append(allowed, http.MethodHead)
			}
		}
		slices.Sort(allowed)
		concrete := strings.NewReplacer("{tenant}", "acme", "{id}", "0000000000000000000000000a").Replace(path)
		for _, method := range []string{"PATCH", "PUT", "DELETE", "POST", "GET"} {
			if slices.Contains(allowed, method) {
				continue
			}
			st, hdr, body := doHeader(t, h, method, concrete, "", bearer("admin-token"))
			got := strings.Split(hdr.Get("Allow"), ", ")
			slices.Sort(got)
			if st != http.StatusMethodNotAllowed || body["error"] != "method_not_allowed" || !slices.Equal(got, allowed) {
				t.Errorf("%s %s: %d Allow %q %v, want 405 method_not_allowed, Allow %v", method, concrete, st, hdr.Get("Allow"), body, allowed)
			}
		}
		paths++
	}
	if paths < 15 {
		t.Fatalf("only %d paths in the document", paths)
	}
}

// A tenant path holding a . or .. segment (as it is or escaped) is a
// tenant name that is not valid, 400 invalid_tenant; it is not cleaned
// into another path and redirected there (a 307 that a client follows to
// another tenant, or to a route it did not ask for).
func TestDotSegmentsInATenantPathAreRefused(t *testing.T) {
	t.Parallel()
	h := newTour(t)
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/tenants/../jobs"},
		{"POST", "/v1/tenants/%2E%2E/jobs"},
		{"POST", "/v1/tenants/%2e/jobs"},
		{"POST", "/v1/tenants/./jobs"},
		{"POST", "/v1/tenants/acme/../beta/jobs"},
		{"GET", "/v1/tenants/.."},
		{"GET", "/v1/tenants/acme/."},
		{"POST", "/v1/tenants//jobs"},
	} {
		body := ""
		if c.method == "POST" {
			body = `{"payload": 1}`
		}
		st, hdr, ans := doHeader(t, h, c.method, c.path, body, bearer("admin-token"))
		if st != http.StatusBadRequest || ans["error"] != "invalid_tenant" || hdr.Get("Location") != "" {
			t.Errorf("%s %s: %d %v (Location %q), want 400 invalid_tenant", c.method, c.path, st, ans, hdr.Get("Location"))
		}
	}
}

// With tokens, auth comes before routing, as the document's description
// says: a request without a valid token is 401 with WWW-Authenticate for a
// method or a path no operation has too (not the 405 or 404 a caller with
// a token gets), and a public route that is sent no Authorization header
// answers as if there were no tokens.
func TestAuthComesBeforeRouting(t *testing.T) {
	t.Parallel()
	h := newTour(t)
	for _, c := range []struct {
		method, path, token string
		status              int
	}{
		{"PATCH", "/v1/tenants", "", http.StatusUnauthorized},
		{"PATCH", "/v1/tenants", "admin-token", http.StatusMethodNotAllowed},
		{"GET", "/v2/nothing", "wrong", http.StatusUnauthorized},
		{"GET", "/v2/nothing", "viewer-token", http.StatusNotFound},
		{"POST", "/", "wrong", http.StatusUnauthorized},
		{"POST", "/", "", http.StatusMethodNotAllowed},
		{"POST", "/v1/tenants/../jobs", "", http.StatusUnauthorized},
	} {
		st, hdr, body := doHeader(t, h, c.method, c.path, "", bearer(c.token))
		if st != c.status || (st == http.StatusUnauthorized && (body["error"] != "unauthorized" || hdr.Get("WWW-Authenticate") == "")) {
			t.Errorf("%s %s (token %q): %d %v, want %d", c.method, c.path, c.token, st, body, c.status)
		}
	}
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(doc.Info.Description, "auth comes first, on any path and for any method") {
		t.Error("the document's description does not say that auth comes before routing")
	}
}
