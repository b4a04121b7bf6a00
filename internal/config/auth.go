package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/throttler-dev/throttler/internal/secret"
)

// Auth holds API tokens. With none, the API has no auth and listens on
// loopback addresses only.
type Auth struct {
	Tokens []Token `toml:"tokens"`
	// InsecureNoAuth allows listening beyond loopback with no tokens (for a
	// network you fully trust). Default false; also the flag
	// --insecure-no-auth.
	InsecureNoAuth bool `toml:"insecure_no_auth"`
}

// Roles of a token.
const (
	RoleAdmin    = "admin"    // everything
	RoleProducer = "producer" // enqueue, read and cancel its tenants' jobs
	RoleViewer   = "viewer"   // read status
)

// Token is one API token. The token itself is never in the file: its
// SHA-256 is (sha256), or it is read from an environment variable
// (token_env) or a file (token_file) when the config loads.
type Token struct {
	Name      string   `toml:"name"`
	SHA256    string   `toml:"sha256"`
	TokenEnv  string   `toml:"token_env"`
	TokenFile string   `toml:"token_file"`
	Role      string   `toml:"role"`
	Tenants   []string `toml:"tenants"`

	// Digest is the SHA-256 of the token, filled by Validate.
	Digest [32]byte `toml:"-"`
}

// AllTenants reports whether the token reaches every tenant.
func (t Token) AllTenants() bool { return slices.Contains(t.Tenants, "*") }

// Reaches reports whether the token's scope includes tenant.
func (t Token) Reaches(tenant string) bool {
	return t.AllTenants() || slices.Contains(t.Tenants, tenant)
}

// checkTokens validates [[auth.tokens]] and computes each token's digest.
func (c *Config) checkTokens() error {
	seen := map[string]bool{}
	for i := range c.Auth.Tokens {
		t := &c.Auth.Tokens[i]
		if t.Name == "" || seen[t.Name] {
			return c.bad(fmt.Sprintf("auth.tokens[%d].name", i), "every token needs a name of its own (for logs); %q is empty or repeated", t.Name)
		}
		seen[t.Name] = true
		if err := c.checkToken("auth.tokens."+t.Name, t); err != nil {
			return err
		}
	}
	return nil
}

// checkToken checks one named token (key is "auth.tokens.NAME").
func (c *Config) checkToken(key string, t *Token) error {
	bad := func(k, format string, args ...any) error { return c.bad(key+"."+k, format, args...) }
	if err := c.readDigest(key, t); err != nil {
		return err
	}
	if t.Role != RoleAdmin && t.Role != RoleProducer && t.Role != RoleViewer {
		return bad("role", "%q is not a role: use \"admin\", \"producer\" or \"viewer\"", t.Role)
	}
	if len(t.Tenants) == 0 {
		return bad("tenants", "name the tenants it may reach, or [\"*\"] for all")
	}
	for _, name := range t.Tenants {
		if name != "*" && !ValidName(name) {
			return bad("tenants", "%q is not a tenant name", name)
		}
	}
	return nil
}

// readDigest fills t.Digest from the one source the token names: its hex
// SHA-256, an environment variable or a file.
func (c *Config) readDigest(key string, t *Token) error {
	bad := func(k, format string, args ...any) error { return c.bad(key+"."+k, format, args...) }
	sources := 0
	for _, v := range []string{t.SHA256, t.TokenEnv, t.TokenFile} {
		if v != "" {
			sources++
		}
	}
	if sources != 1 {
		return bad("sha256", "give exactly one of sha256 (the hex SHA-256 of the token: `throttler token new` prints it), token_env or token_file")
	}
	switch {
	case t.SHA256 != "":
		raw, err := hex.DecodeString(strings.TrimSpace(t.SHA256))
		if err != nil || len(raw) != 32 {
			return bad("sha256", "must be 64 hex digits (the SHA-256 of the token, not the token)")
		}
		copy(t.Digest[:], raw)
	default:
		v, err := secret.Resolve(key+".token", secret.Ref{Env: t.TokenEnv, File: t.TokenFile})
		if err != nil {
			var se *secret.Error
			if errors.As(err, &se) {
				return c.bad(se.Key, "%s", se.Reason)
			}
			return err
		}
		t.Digest = sha256.Sum256([]byte(v.Reveal()))
	}
	return nil
}
