package dispatch

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
)

// tlsProblem names a TLS failure of a downstream's connection in the words
// a user looks for (unknown authority, expired certificate, name mismatch)
// and says which config key to look at; "" if err is not a TLS failure.
// Go's own text follows it in last_error: it has the details.
func tlsProblem(err error, r Route) string {
	key := "downstreams." + r.Downstream
	trusted := "the system's roots"
	if r.Outbound != nil && r.Outbound.Config().TLSCAFile != "" {
		trusted = key + ".tls_ca_file"
	}
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var record tls.RecordHeaderError
	var verify *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case errors.As(err, &unknown):
		return "TLS: unknown authority: the downstream's certificate is not signed by a CA that " + trusted + " trusts"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "TLS: expired certificate: the downstream's certificate has expired or is not valid yet (or this machine's clock is off)"
	case errors.As(err, &host):
		return "TLS: name mismatch: the downstream's certificate is not for the name the url gives (set " + key + ".tls_server_name if it is another)"
	case errors.As(err, &invalid), errors.As(err, &verify):
		return "TLS: the downstream's certificate cannot be verified against " + trusted
	case errors.As(err, &record):
		return "TLS: the downstream does not speak TLS on this port (is the url https:// where it should be http://?)"
	case errors.As(err, &op) && op.Op == "remote error" && strings.Contains(op.Err.Error(), "tls"):
		return "TLS: the downstream refused the handshake (does it want a client certificate? see " + key + ".tls_cert_file)"
	}
	return ""
}
