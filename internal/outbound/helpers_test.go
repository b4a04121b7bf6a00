package outbound

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
)

// Secret values in these tests are distinctive, so a leak is found by
// searching for them.
const (
	twilioToken = "tw-SECRET-4a1d9c"
	stripeKey   = "sk_test_SECRET_77f2b"
	vendorKey   = "vk-SECRET-0e5a"
	// hookSecret is the Standard Webhooks spec's test secret.
	hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

// secretFile writes value (with a trailing newline, as editors do) to a
// file of its own and returns its path.
func secretFile(t testing.TB, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func compile(t testing.TB, d config.Downstream) *Downstream {
	t.Helper()
	o, err := Compile("v", d)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func ptr[T any](v T) *T { return &v }
