package outbound

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"throttler/internal/config"
	"throttler/internal/secret"
)

// SecretPrefix starts a Standard Webhooks secret: whsec_<base64 key>.
const SecretPrefix = "whsec_"

// compileSigning reads the signing secrets (none if ref is zero): one or
// more, space-separated, each "whsec_" and the key in standard base64. As
// in the Standard Webhooks reference library, the prefix may be left out
// (bare base64); anything else is refused, naming its position, never its
// text.
func compileSigning(key string, ref secret.Ref) ([]secret.Value, error) {
	if ref.IsZero() {
		return nil, nil
	}
	v, err := secret.Resolve(key+".signing_secret", ref)
	if err != nil {
		return nil, configError(err)
	}
	fields := strings.Fields(v.Reveal())
	keys := make([]secret.Value, 0, len(fields))
	for i, f := range fields {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(f, SecretPrefix))
		if err != nil || len(raw) == 0 {
			return nil, &config.Error{Key: usedKey(key+".signing_secret", ref), Reason: fmt.Sprintf(
				"secret %d of %d is not whsec_ followed by a key in standard base64 (as `openssl rand -base64 32` prints one)", i+1, len(fields))}
		}
		keys = append(keys, secret.New(string(raw)))
	}
	return keys, nil
}

// Sign adds the Standard Webhooks headers to h for a request whose body is
// exactly body: webhook-id (id, the job id: the same on every attempt),
// webhook-timestamp (at, in Unix seconds) and webhook-signature, one
// "v1,<base64 HMAC-SHA256>" per secret, space-separated, so a receiver
// that knows any one of them (rotation) accepts it. It does nothing for a
// downstream without signing secrets. Call it at the send, not at Build:
// the wait at the gate can be long, and receivers refuse old timestamps.
func (o *Downstream) Sign(h http.Header, id string, body []byte, at time.Time) {
	if len(o.keys) == 0 {
		return
	}
	ts := strconv.FormatInt(at.Unix(), 10)
	sigs := make([]string, len(o.keys))
	for i, k := range o.keys {
		sigs[i] = "v1," + signature([]byte(k.Reveal()), id, ts, body)
	}
	h.Set("Webhook-Id", id)
	h.Set("Webhook-Timestamp", ts)
	h.Set("Webhook-Signature", strings.Join(sigs, " "))
}

// signature is base64(HMAC-SHA256(key, id.timestamp.body)).
func signature(key []byte, id, ts string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
