package outbound

import (
	"context"
	"encoding/base64"
	"net/http"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
)

// twilioPayload is BenchmarkVendorRequest's payload (internal/dispatch).
var twilioPayload = []byte(`{"To":"+15550100","From":"+15550199","Body":"Your code is 123456","MediaUrl":["https://x.example/1.png","https://x.example/2.png"]}`)

// The parts of an attempt that a vendor adds, apart, with their
// allocations: go test -run '^$' -bench . -benchmem ./internal/outbound
func BenchmarkEncodeForm(b *testing.B) {
	for _, c := range []struct {
		name   string
		encode func([]byte, string) ([]byte, error)
	}{{"scanner", func(p []byte, a string) ([]byte, error) { return EncodeForm(p, a) }}, {"reference", func(p []byte, a string) ([]byte, error) { return encodeFormRef(p, a) }}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.encode(twilioPayload, config.FormRepeat); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSign(b *testing.B) {
	o := compile(b, config.Downstream{URL: "https://x.example/", SigningSecretFile: secretFile(b, hookSecret)})
	body := []byte("To=%2B15550100&From=%2B15550199&Body=Your+code+is+123456")
	at := time.Unix(1700000000, 0)
	b.ReportAllocs()
	for b.Loop() {
		o.Sign(http.Header{}, "01knb4s3vq5m8h7xkq2d9e0001", body, at)
	}
}

// BenchmarkBuild builds (and signs, for the vendor) the attempts that
// BenchmarkVendorRequest sends.
func BenchmarkBuild(b *testing.B) {
	key := SecretPrefix + base64.StdEncoding.EncodeToString([]byte("a key of the tests' own, 32 bytes"))
	for _, c := range []struct {
		name string
		d    config.Downstream
	}{
		{"plain", config.Downstream{URL: "http://127.0.0.1:9000/send"}},
		{"vendor", config.Downstream{URL: "http://127.0.0.1:9000/2010-04-01/Accounts/AC0123/Messages.json", Body: config.BodyForm,
			Auth:              config.DownstreamAuth{Type: config.AuthBasic, Username: "AC0123", PasswordFile: secretFile(b, twilioToken)},
			SigningSecretFile: secretFile(b, key)}},
	} {
		o := compile(b, c.d)
		j := BuildJob{ID: "01knb4s3vq5m8h7xkq2d9e0001", Tenant: "t1", Attempt: 1, Payload: twilioPayload}
		at := time.Unix(1700000000, 0)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, body, err := o.Build(context.Background(), j)
				if err != nil {
					b.Fatal(err)
				}
				o.Sign(req.Header, j.ID, body, at)
			}
		})
	}
}
