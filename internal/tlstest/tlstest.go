// Package tlstest owns the private PKI that tests use for HTTPS and mutual
// TLS: a CA, a server certificate for 127.0.0.1 and localhost (or the names
// given), and a client certificate, all made fresh for one test with
// crypto/x509 and written as PEM files to its temporary directory, so
// config keys such as tls_ca_file can point at them.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is one test's CA and the certificates it issued. Its files live in
// Dir, which the test removes when it ends.
type PKI struct {
	Dir    string
	CAFile string // the CA certificate (PEM): what tls_ca_file names
	// ServerCertFile and ServerKeyFile are the server's certificate and key.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate (mutual
	// TLS): what tls_cert_file and tls_key_file name.
	ClientCertFile, ClientKeyFile string

	CA     *x509.Certificate
	CAPool *x509.CertPool
	Server tls.Certificate
	Client tls.Certificate

	caKey *ecdsa.PrivateKey
}

// Leaf describes a certificate for Issue.
type Leaf struct {
	CommonName string
	// Hosts are DNS names or IP addresses (the server's names).
	Hosts []string
	// Client makes a client certificate (ExtKeyUsageClientAuth).
	Client bool
	// NotAfter is when it expires (zero: in a day). A past time makes an
	// expired certificate.
	NotAfter time.Time
}

// New makes a CA, a server certificate for hosts (default 127.0.0.1, ::1
// and localhost) and a client certificate, in t.TempDir().
func New(t testing.TB, hosts ...string) *PKI {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	p := &PKI{Dir: t.TempDir()}
	p.caKey = newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "throttler test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if p.CA, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.CAPool = x509.NewCertPool()
	p.CAPool.AddCert(p.CA)
	p.CAFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	p.ServerCertFile, p.ServerKeyFile = p.Issue(t, "server", Leaf{CommonName: hosts[0], Hosts: hosts})
	p.ClientCertFile, p.ClientKeyFile = p.Issue(t, "client", Leaf{CommonName: "throttler", Client: true})
	p.Server = p.load(t, p.ServerCertFile, p.ServerKeyFile)
	p.Client = p.load(t, p.ClientCertFile, p.ClientKeyFile)
	return p
}

// Issue makes one more certificate signed by the CA and writes it as
// name.pem and name.key in Dir.
func (p *PKI) Issue(t testing.TB, name string, l Leaf) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.CommonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	if !tmpl.NotAfter.After(tmpl.NotBefore) {
		tmpl.NotBefore = tmpl.NotAfter.Add(-time.Hour)
	}
	if l.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+".key", "PRIVATE KEY", pkcs8)
}

// ServerConfig is a server's TLS config with the server certificate; with
// requireClient, it demands a client certificate from this CA.
func (p *PKI) ServerConfig(requireClient bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{p.Server}, MinVersion: tls.VersionTLS12}
	if requireClient {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = p.CAPool
	}
	return c
}

// ClientConfig trusts the CA and presents the client certificate.
func (p *PKI) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: p.CAPool, Certificates: []tls.Certificate{p.Client}, MinVersion: tls.VersionTLS12}
}

func (p *PKI) write(t testing.TB, name, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.Dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *PKI) load(t testing.TB, certFile, keyFile string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
