package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Token is a bearer token a test's config knows.
type Token struct {
	Name, Secret, Role string
	Tenants            []string
}

// AuthTokens is the [[auth.tokens]] tables of a config that knows tokens,
// each by the SHA-256 of its secret, as an operator writes them.
func AuthTokens(tokens ...Token) string {
	var b strings.Builder
	for _, tok := range tokens {
		sum := sha256.Sum256([]byte(tok.Secret))
		tenants := make([]string, len(tok.Tenants))
		for i, tn := range tok.Tenants {
			tenants[i] = fmt.Sprintf("%q", tn)
		}
		fmt.Fprintf(&b, "[[auth.tokens]]\nname = %q\nsha256 = %q\nrole = %q\ntenants = [%s]\n",
			tok.Name, hex.EncodeToString(sum[:]), tok.Role, strings.Join(tenants, ", "))
	}
	return b.String()
}
