package queue

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"time"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// idLen is the length of every job id.
const idLen = 26

// NewID returns a job id: 48 bits of milliseconds then 80 random bits, in
// lower-case Crockford base32 (26 characters). Ids sort by creation time, so
// the embedded store appends to its job index instead of scattering writes.
func NewID(now time.Time) string {
	b := idBytes(now)
	return idEncoding.EncodeToString(b[:])
}

// NewTaggedID is NewID with its last byte set to tag (a backend's shard or
// partition), so that a job is found from its id alone.
func NewTaggedID(now time.Time, tag byte) string {
	b := idBytes(now)
	b[15] = tag
	return idEncoding.EncodeToString(b[:])
}

func idBytes(now time.Time) [16]byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return b
}

// ValidID reports whether s could be a job id (so lookups of junk are cheap
// and never reach the store).
func ValidID(s string) bool {
	_, ok := IDTag(s)
	return ok
}

// IDTag is the last byte of a job id (the tag of NewTaggedID); false if s
// is not a job id.
func IDTag(s string) (byte, bool) {
	if len(s) != idLen {
		return 0, false
	}
	b, err := idEncoding.DecodeString(s)
	if err != nil || len(b) != 16 {
		return 0, false
	}
	return b[15], true
}
