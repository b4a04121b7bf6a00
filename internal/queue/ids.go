package queue

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"time"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID returns a job id: 48 bits of milliseconds then 80 random bits, in
// lower-case Crockford base32 (26 characters). Ids sort by creation time, so
// the embedded store appends to its job index instead of scattering writes.
func newID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return idEncoding.EncodeToString(b[:])
}

// validID reports whether s could be a job id (so lookups of junk are cheap
// and never reach the store).
// idLen is the length of every job id.
const idLen = 26

func validID(s string) bool {
	if len(s) != idLen {
		return false
	}
	_, err := idEncoding.DecodeString(s)
	return err == nil
}
