package outbound

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/tlstest"
)

// A compiled TLS config does mutual TLS with a private CA: the request
// reaches a server that demands the client certificate.
func TestTLSCompileAndHandshake(t *testing.T) {
	t.Parallel()
	pki := tlstest.New(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.TLS = pki.ServerConfig(true)
	srv.StartTLS()
	defer srv.Close()
	d := config.Downstream{URL: srv.URL, TLSCAFile: pki.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile}
	o := compile(t, d)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: o.TLSConfig()}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "throttler" {
		t.Fatalf("%q", b)
	}
	// The fingerprint: the same files give the same key, another CA or
	// server name another; no TLS keys, none at all.
	if again := compile(t, d); again.TLSKey() != o.TLSKey() || o.TLSKey() == "" {
		t.Error("TLSKey not stable")
	}
	other := tlstest.New(t)
	for _, changed := range []config.Downstream{
		{URL: srv.URL, TLSCAFile: other.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile},
		{URL: srv.URL, TLSCAFile: pki.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile, TLSServerName: "localhost"},
		{URL: srv.URL, TLSCAFile: pki.CAFile},
	} {
		if compile(t, changed).TLSKey() == o.TLSKey() {
			t.Errorf("same TLSKey for %+v", changed)
		}
	}
	plain := compile(t, config.Downstream{URL: srv.URL})
	if plain.TLSConfig() != nil || plain.TLSKey() != "" {
		t.Error("system defaults got a TLS config")
	}
	if c := compile(t, config.Downstream{URL: srv.URL, TLSServerName: "api.vendor.example"}).TLSConfig(); c == nil || c.ServerName != "api.vendor.example" || c.RootCAs != nil {
		t.Errorf("server name only: %+v", c)
	}
	// TLSConfig hands out copies.
	o.TLSConfig().ServerName = "changed"
	if o.TLSConfig().ServerName != "" {
		t.Error("TLSConfig shared")
	}
}

func TestTLSFilesRefused(t *testing.T) {
	t.Parallel()
	pki := tlstest.New(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("not a pem file\n"), 0o600)
	badCert := filepath.Join(dir, "bad-cert.pem")
	os.WriteFile(badCert, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600)
	missing := filepath.Join(dir, "missing.pem")
	url := "https://bank.example/"
	cases := []struct {
		d         config.Downstream
		key, want string
	}{
		{config.Downstream{URL: url, TLSCAFile: garbage}, "downstreams.bank.tls_ca_file", "holds no PEM certificate"},
		{config.Downstream{URL: url, TLSCAFile: missing}, "downstreams.bank.tls_ca_file", "cannot read"},
		{config.Downstream{URL: url, TLSCAFile: pki.ClientKeyFile}, "downstreams.bank.tls_ca_file", "holds no PEM certificate"},
		{config.Downstream{URL: url, TLSCertFile: pki.ClientCertFile}, "downstreams.bank.tls_cert_file", "both"},
		{config.Downstream{URL: url, TLSCertFile: missing, TLSKeyFile: pki.ClientKeyFile}, "downstreams.bank.tls_cert_file", "cannot read"},
		{config.Downstream{URL: url, TLSCertFile: garbage, TLSKeyFile: pki.ClientKeyFile}, "downstreams.bank.tls_cert_file", "no PEM CERTIFICATE"},
		{config.Downstream{URL: url, TLSCertFile: badCert, TLSKeyFile: pki.ClientKeyFile}, "downstreams.bank.tls_cert_file", "x509"},
		{config.Downstream{URL: url, TLSCertFile: pki.ClientCertFile, TLSKeyFile: missing}, "downstreams.bank.tls_key_file", "cannot read"},
		{config.Downstream{URL: url, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ServerKeyFile}, "downstreams.bank.tls_key_file", "does not match"},
		{config.Downstream{URL: url, TLSCertFile: pki.ClientCertFile, TLSKeyFile: garbage}, "downstreams.bank.tls_key_file", "cannot be used with tls_cert_file"},
		{config.Downstream{URL: "http://bank.example/", TLSCAFile: pki.CAFile}, "downstreams.bank.url", "https://"},
	}
	keyPEM, _ := os.ReadFile(pki.ServerKeyFile)
	for _, c := range cases {
		_, err := Compile("bank", c.d)
		var cerr *config.Error
		if !errors.As(err, &cerr) || cerr.Key != c.key || !strings.Contains(cerr.Reason, c.want) {
			t.Errorf("%+v: got %v, want %s and %q", c.d, err, c.key, c.want)
		}
		if err != nil && strings.Contains(err.Error(), strings.Split(string(keyPEM), "\n")[1]) {
			t.Errorf("the error holds the key: %v", err)
		}
	}
}
