package outbound

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"os"

	"github.com/throttler-dev/throttler/internal/config"
)

// tlsSetup is a downstream's TLS config and its fingerprint.
type tlsSetup struct {
	config *tls.Config
	key    string
}

// TLSConfig is the TLS config for this downstream's connections, nil when
// the system's defaults do (no CA file, client certificate or server
// name). Each call returns a copy: the caller may change it.
func (o *Downstream) TLSConfig() *tls.Config {
	if o.tls == nil {
		return nil
	}
	return o.tls.config.Clone()
}

// TLSKey identifies the TLS config (a fingerprint of the trusted CAs, the
// client certificate and the server name; "" for the system's defaults):
// downstreams with equal keys can share one http.Transport.
func (o *Downstream) TLSKey() string {
	if o.tls == nil {
		return ""
	}
	return o.tls.key
}

// compileTLS reads and parses the TLS files of downstream key.
func compileTLS(key string, d config.Downstream) (*tlsSetup, error) {
	if d.TLSCAFile == "" && d.TLSCertFile == "" && d.TLSServerName == "" {
		return nil, nil
	}
	bad := func(k, reason string) error { return &config.Error{Key: key + "." + k, Reason: reason} }
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: d.TLSServerName}
	sum := sha256.New()
	part := func(b []byte) { // length-prefixed, so parts cannot run into each other
		sum.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		sum.Write(b)
	}
	part([]byte(d.TLSServerName))
	if d.TLSCAFile != "" {
		raw, err := os.ReadFile(d.TLSCAFile)
		if err != nil {
			return nil, bad("tls_ca_file", "cannot read: "+err.Error())
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			return nil, bad("tls_ca_file", d.TLSCAFile+" holds no PEM certificate: it should hold the CA certificates that signed the downstream's")
		}
		c.RootCAs = pool
		part(raw)
	} else {
		part(nil)
	}
	if d.TLSCertFile != "" {
		pair, err := loadPair(bad, d.TLSCertFile, d.TLSKeyFile)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{pair}
		for _, der := range pair.Certificate {
			part(der)
		}
	}
	return &tlsSetup{config: c, key: hex.EncodeToString(sum.Sum(nil))}, nil
}

// loadPair reads a client certificate and its key, blaming the file at
// fault: a certificate that does not parse is tls_cert_file's, a key that
// does not parse or match is tls_key_file's. Errors never hold the key.
func loadPair(bad func(k, reason string) error, certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, bad("tls_cert_file", "cannot read: "+err.Error())
	}
	var block *pem.Block
	for rest := certPEM; ; {
		if block, rest = pem.Decode(rest); block == nil || block.Type == "CERTIFICATE" {
			break
		}
	}
	if block == nil {
		return tls.Certificate{}, bad("tls_cert_file", certFile+" holds no PEM CERTIFICATE")
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return tls.Certificate{}, bad("tls_cert_file", certFile+": "+err.Error())
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, bad("tls_key_file", "cannot read: "+err.Error())
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, bad("tls_key_file", "cannot be used with tls_cert_file "+certFile+": "+err.Error())
	}
	return pair, nil
}
