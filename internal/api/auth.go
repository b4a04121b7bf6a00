package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/throttler-dev/throttler/internal/config"
)

// access is what a route needs of a token.
type access int

const (
	read    access = iota // any role
	write                 // producer or admin
	operate               // admin: hold and resume tenants, set their policies
)

type principalKey struct{}

// principal is who made the request: nil when no tokens are configured.
func principal(r *http.Request) *config.Token {
	t, _ := r.Context().Value(principalKey{}).(*config.Token)
	return t
}

// authenticate checks the bearer token (when tokens are configured) and
// puts who it is in the request's context. Every token is compared, in
// constant time, whichever matches: how long it takes says nothing of which
// token, or how much of one, was right.
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := s.config().Auth.Tokens
		// The page, its script and the OpenAPI document hold no data: the
		// page asks for a token and fetches with it.
		public := r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/" || r.URL.Path == "/static/app.js" || r.URL.Path == "/openapi.json"
		if len(tokens) == 0 || (public && r.Header.Get("Authorization") == "") {
			next.ServeHTTP(w, r)
			return
		}
		presented, ok := bearerToken(r.Header.Get("Authorization"))
		digest := sha256.Sum256([]byte(presented))
		match := -1
		for i := range tokens {
			if subtle.ConstantTimeCompare(digest[:], tokens[i].Digest[:]) == 1 {
				match = i
			}
		}
		if !ok || presented == "" || match < 0 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="throttler"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "send a valid API token: Authorization: Bearer <token>", nil)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, &tokens[match])))
	})
}

// bearerToken is the token of an Authorization header of the Bearer scheme,
// whose name is case-insensitive (RFC 9110, 11.1): "bearer" and "BEARER"
// are "Bearer" too, and spaces may follow it.
func bearerToken(v string) (string, bool) {
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// authorize says whether the request's token may do a of tenant.
func authorize(r *http.Request, tenant string, a access) error {
	t := principal(r)
	if t == nil {
		return nil
	}
	if a == write && t.Role == config.RoleViewer {
		return errorf(http.StatusForbidden, "forbidden", "token %q is a viewer: it cannot change anything", t.Name)
	}
	if a == operate && t.Role != config.RoleAdmin {
		return errorf(http.StatusForbidden, "forbidden", "token %q is a %s: only an admin token can hold, resume or set the policy of a tenant", t.Name, t.Role)
	}
	if tenant != "" && !t.Reaches(tenant) {
		return errorf(http.StatusForbidden, "forbidden", "token %q may not reach tenant %q", t.Name, tenant)
	}
	return nil
}

// reachesJob says whether the request's token may see a job of tenant. A
// job outside its scope is answered as if it did not exist, so that
// nothing, not even whether an id exists, leaks across tenants.
func reachesJob(r *http.Request, tenant string) bool {
	t := principal(r)
	return t == nil || t.Reaches(tenant)
}
