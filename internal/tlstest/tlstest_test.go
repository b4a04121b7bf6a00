package tlstest

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The PKI serves mutual TLS: a client with its config gets through; one
// without the client certificate does not.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	p := New(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.TLS = p.ServerConfig(true)
	srv.StartTLS()
	defer srv.Close()
	get := func(c *tls.Config) (string, error) {
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
		defer client.CloseIdleConnections()
		resp, err := client.Get(srv.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := get(p.ClientConfig()); err != nil || got != "throttler" {
		t.Fatalf("%q %v", got, err)
	}
	if _, err := get(&tls.Config{RootCAs: p.CAPool}); err == nil {
		t.Fatal("no client certificate, yet served")
	}
	if _, err := get(&tls.Config{}); err == nil {
		t.Fatal("system roots trusted the test CA")
	}
}
