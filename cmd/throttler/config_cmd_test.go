package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/tlstest"
)

// Secret values of these tests: distinctive, so that finding one in the
// output is a leak.
const (
	checkPassword = "S3cr3t-check-pw-51c0"
	checkToken    = "S3cr3t-check-tok-9be2"
	checkHook     = "whsec_Y2hlY2staG9vay1zZWNyZXQtN2Q0YQ=="
)

// vendorsConfig has a form vendor with basic auth (password from
// $THROTTLER_TEST_CHECK_PW), a bearer vendor (token from a file) with job
// rules and a static header, and a signed webhook over mutual TLS (secret
// from $THROTTLER_TEST_CHECK_HOOK). tokenFile, the PKI's files and extra
// (TOML appended to the bank) fill it in.
func vendorsConfig(t *testing.T, tokenFile string, pki *tlstest.PKI, extra string) string {
	t.Helper()
	body := fmt.Sprintf(`
[downstreams.twilio]
url = "https://api.twilio.example/2010-04-01/Accounts/AC0123/Messages.json"
body = "form"
auth = { type = "basic", username = "AC0123", password_env = "THROTTLER_TEST_CHECK_PW" }
[downstreams.stripe]
url = "https://api.stripe.example/v1/charges?version=2024"
headers = { Stripe-Version = "2024-06-20" }
auth = { type = "bearer", token_file = %q }
job_paths = ["/v1/*"]
job_methods = ["DELETE"]
job_headers = ["Stripe-Account"]
[downstreams.bank]
url = "https://hooks.bank.example/in"
signing_secret_env = "THROTTLER_TEST_CHECK_HOOK"
tls_ca_file = %q
tls_cert_file = %q
tls_key_file = %q
tls_server_name = "hooks.internal"
%s
[tenant_defaults]
downstream = "twilio"
`, tokenFile, pki.CAFile, pki.ClientCertFile, pki.ClientKeyFile, extra)
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeSecretFile(t *testing.T, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// noSecretIn fails the test if out holds any of the test's secret values.
func noSecretIn(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range []string{checkPassword, checkToken, checkHook, strings.TrimPrefix(checkHook, "whsec_")} {
		if strings.Contains(out, s) {
			t.Errorf("%s shows a secret value (%.12s…):\n%s", what, s, out)
		}
	}
}

// config check compiles every downstream and describes its auth, signing
// and TLS by where each secret comes from and whether it could be read,
// never by its value.
func TestConfigCheckDescribesDownstreams(t *testing.T) {
	t.Setenv("THROTTLER_TEST_CHECK_PW", checkPassword)
	t.Setenv("THROTTLER_TEST_CHECK_HOOK", checkHook)
	pki := tlstest.New(t)
	tokenFile := writeSecretFile(t, checkToken)
	file := vendorsConfig(t, tokenFile, pki, "")
	out, errOut, err := runCLI(t, nil, "config", "check", "--config", file)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	for _, want := range []string{
		"downstream twilio: POST https://api.twilio.example/2010-04-01/Accounts/AC0123/Messages.json, body form (arrays repeat)\n",
		"  auth: basic, password from $THROTTLER_TEST_CHECK_PW (set)\n",
		"downstream stripe: POST https://api.stripe.example/v1/charges?version=…, body json\n",
		"  headers: Stripe-Version (values not shown)\n",
		"  auth: bearer, token from file " + tokenFile + " (set)\n",
		"  a job may ask: paths /v1/*; methods DELETE, POST; headers Stripe-Account\n",
		"  signing: Standard Webhooks, secret from $THROTTLER_TEST_CHECK_HOOK (set)\n",
		"  tls: CAs from " + pki.CAFile + ", client certificate " + pki.ClientCertFile + " (key " + pki.ClientKeyFile + "), server name hooks.internal\n",
		"  tls: the system's CAs\n",
		file + ": ok: 3 downstream(s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	noSecretIn(t, "config check", out+errOut)
}

// A secret that is not set, a file that cannot be read and a TLS file that
// is not a certificate are refused (exit 2), each naming its key, and the
// description says which secret could not be read.
func TestConfigCheckRefusesWhatCannotBeRead(t *testing.T) {
	t.Setenv("THROTTLER_TEST_CHECK_PW", "")
	t.Setenv("THROTTLER_TEST_CHECK_HOOK", checkHook)
	pki := tlstest.New(t)
	notPEM := writeSecretFile(t, "not a certificate")
	for name, c := range map[string]struct {
		tokenFile, extra string
		key, says        string
	}{
		"an unset variable": {writeSecretFile(t, checkToken), "", "downstreams.twilio.auth.password_env", "password from $THROTTLER_TEST_CHECK_PW (not set or empty)"},
		"a missing file":    {filepath.Join(t.TempDir(), "absent"), "", "downstreams.stripe.auth.token_file", "(not readable or empty)"},
		"a bad CA file": {writeSecretFile(t, checkToken), "[downstreams.broken]\nurl = \"https://x.example/\"\ntls_ca_file = " + fmt.Sprintf("%q", notPEM),
			"downstreams.broken.tls_ca_file", "tls: CAs from " + notPEM},
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, err := runCLI(t, nil, "config", "check", "--config", vendorsConfig(t, c.tokenFile, pki, c.extra))
			var ee exitError
			if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.key) || strings.Contains(out, ": ok:") {
				t.Fatalf("err %v, want exit 2 naming %s\n%s%s", err, c.key, out, errOut)
			}
			if !strings.Contains(out, c.says) {
				t.Errorf("output lacks %q:\n%s", c.says, out)
			}
			noSecretIn(t, "config check", out+errOut+err.Error())
		})
	}
}
