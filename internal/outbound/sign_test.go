package outbound

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
)

// verify is a Standard Webhooks receiver written from the spec, apart
// from the signer: it accepts the request if any v1 signature matches
// any of its secrets.
func verify(secrets []string, h http.Header, body []byte) error {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	if id == "" || ts == "" {
		return errors.New("missing webhook-id or webhook-timestamp")
	}
	if _, err := strconv.ParseInt(ts, 10, 64); err != nil {
		return err
	}
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil {
			return err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		want := mac.Sum(nil)
		for _, sig := range strings.Split(h.Get("webhook-signature"), " ") {
			version, b64, _ := strings.Cut(sig, ",")
			got, err := base64.StdEncoding.DecodeString(b64)
			if version == "v1" && err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return errors.New("no signature matches")
}

// The Standard Webhooks specification's published test vector.
func TestSignSpecVector(t *testing.T) {
	t.Parallel()
	o := compile(t, config.Downstream{URL: "https://x.example/", SigningSecretFile: secretFile(t, hookSecret)})
	h := http.Header{}
	body := []byte(`{"test": 2432232314}`)
	o.Sign(h, "msg_p5jXN8AQM9LWM0D4loKWxJek", body, time.Unix(1614265330, 0))
	if got := h.Get("webhook-signature"); got != "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" {
		t.Errorf("signature %q", got)
	}
	if h.Get("webhook-id") != "msg_p5jXN8AQM9LWM0D4loKWxJek" || h.Get("webhook-timestamp") != "1614265330" {
		t.Errorf("headers %v", h)
	}
	if err := verify([]string{hookSecret}, h, body); err != nil {
		t.Error(err)
	}
	if verify([]string{hookSecret}, h, append(body, ' ')) == nil {
		t.Error("a changed body verifies")
	}
}

// Two secrets (rotation) give two signatures, each verifying on its own;
// a bare base64 key (no whsec_) is taken as the reference library takes it.
func TestSignRotation(t *testing.T) {
	t.Parallel()
	second := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another key of thirty-two bytes!"))
	bare := base64.StdEncoding.EncodeToString([]byte("a third key"))
	o := compile(t, config.Downstream{URL: "https://x.example/", SigningSecretFile: secretFile(t, "  "+hookSecret+"  "+second+"\n"+bare)})
	h := http.Header{}
	body := []byte("a=1")
	o.Sign(h, "job-1", body, time.Unix(1700000000, 0))
	if n := len(strings.Fields(h.Get("webhook-signature"))); n != 3 {
		t.Fatalf("%d signatures: %s", n, h.Get("webhook-signature"))
	}
	for _, s := range []string{hookSecret, second, bare} {
		if err := verify([]string{s}, h, body); err != nil {
			t.Errorf("secret %d: %v", len(s), err)
		}
	}
	if verify([]string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("not ours"))}, h, body) == nil {
		t.Error("a stranger's secret verifies")
	}
	// Unsigned downstreams add nothing.
	plain := compile(t, config.Downstream{URL: "https://x.example/"})
	h = http.Header{}
	plain.Sign(h, "job-1", body, time.Now())
	if len(h) != 0 || plain.Signs() || !o.Signs() {
		t.Errorf("unsigned: %v", h)
	}
}

func TestSigningSecretRefused(t *testing.T) {
	t.Parallel()
	const distinctive = "whsec_NOT*BASE64*SECRET"
	for _, content := range []string{distinctive, hookSecret + " " + distinctive, "whsec_", "  \n"} {
		_, err := Compile("hooks", config.Downstream{URL: "https://x.example/", SigningSecretFile: secretFile(t, content)})
		var cerr *config.Error
		if !errors.As(err, &cerr) || cerr.Key != "downstreams.hooks.signing_secret_file" {
			t.Errorf("%q: %v", content, err)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("the error holds the secret: %v", err)
		}
	}
}
