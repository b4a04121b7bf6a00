package outbound

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/secret"
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
// exactly body: webhook-id (id: the message's, the same on every attempt of
// it: a delivery's job id, a callback's callback.MessageID),
// webhook-timestamp (at, in Unix seconds) and webhook-signature, one
// "v1,<base64 HMAC-SHA256>" per secret, space-separated, so a receiver
// that knows any one of them (rotation) accepts it. It does nothing for a
// downstream without signing secrets. Call it at the send, not at Build:
// the wait at the gate can be long, and receivers refuse old timestamps.
//
// It runs on every attempt, so it allocates little: a keyed HMAC per
// secret from a pool (hmac.New costs a dozen allocations), the signature
// header built in one string, and the three values in one slice.
func (o *Downstream) Sign(h http.Header, id string, body []byte, at time.Time) {
	sign(o.macs, h, id, body, at)
}

// Signer signs what is not a downstream's attempt (the callbacks of
// [callbacks]) as Downstream.Sign signs an attempt.
type Signer struct {
	macs []*sync.Pool
}

// CompileSigner reads the signing secrets of section key (such as
// "callbacks") from ref; errors as compileSigning's.
func CompileSigner(key string, ref secret.Ref) (*Signer, error) {
	keys, err := compileSigning(key, ref)
	if err != nil {
		return nil, err
	}
	return &Signer{macs: macPools(keys)}, nil
}

// Sign is Downstream.Sign, with the signer's secrets.
func (s *Signer) Sign(h http.Header, id string, body []byte, at time.Time) {
	sign(s.macs, h, id, body, at)
}

func sign(macs []*sync.Pool, h http.Header, id string, body []byte, at time.Time) {
	if len(macs) == 0 {
		return
	}
	var tsBuf [20]byte // any int64 in decimal
	ts := strconv.AppendInt(tsBuf[:0], at.Unix(), 10)
	var sig strings.Builder
	sig.Grow(len(macs) * (len("v1, ") + base64.StdEncoding.EncodedLen(sha256.Size)))
	for i, pool := range macs {
		if i > 0 {
			sig.WriteByte(' ')
		}
		sig.WriteString("v1,")
		m := pool.Get().(*mac)
		sig.Write(m.sign(id, ts, body))
		pool.Put(m)
	}
	// Canonical names set directly, as h.Set would, sharing one backing
	// array; each entry's capacity is its length, so an Add elsewhere
	// copies rather than writes into its neighbour.
	vals := []string{id, string(ts), sig.String()}
	h["Webhook-Id"] = vals[0:1:1]
	h["Webhook-Timestamp"] = vals[1:2:2]
	h["Webhook-Signature"] = vals[2:3:3]
}

// mac is an HMAC-SHA256 keyed with one signing key, with room for what it
// writes; a pool per key lends them to concurrent Signs.
type mac struct {
	h       hash.Hash
	scratch []byte
}

// macPools makes a pool of *mac for each key.
func macPools(keys []secret.Value) []*sync.Pool {
	pools := make([]*sync.Pool, len(keys))
	for i, k := range keys {
		pools[i] = &sync.Pool{New: func() any {
			return &mac{h: hmac.New(sha256.New, []byte(k.Reveal())), scratch: make([]byte, 0, 128)}
		}}
	}
	return pools
}

// sign returns base64(HMAC-SHA256(key, id.timestamp.body)), in m's
// scratch: valid until m's next use.
func (m *mac) sign(id string, ts, body []byte) []byte {
	m.h.Reset()
	m.scratch = append(append(append(append(m.scratch[:0], id...), '.'), ts...), '.')
	m.h.Write(m.scratch)
	m.h.Write(body)
	m.scratch = m.h.Sum(m.scratch[:0])
	n := len(m.scratch)
	m.scratch = base64.StdEncoding.AppendEncode(m.scratch, m.scratch[:n])
	return m.scratch[n:]
}
