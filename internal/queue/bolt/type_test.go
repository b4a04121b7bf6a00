package bolt

import (
	"encoding/hex"
	"testing"

	"github.com/throttler-dev/throttler/internal/queue"
)

// A job's type (for a Go handler) round-trips in its record; a record
// written before types were kept (version 2) still reads, with none.
func TestJobRecordKeepsTheType(t *testing.T) {
	t.Parallel()
	j := queue.Job{ID: "t", Tenant: "acme", State: queue.StateQueued, Type: "email:welcome", Request: &queue.JobRequest{Path: "/x"}}
	got, inline, err := decodeJob(encodeJob(nil, j, []byte(`{}`)), "t")
	if err != nil || got.Type != "email:welcome" || got.Request == nil || string(inline) != `{}` {
		t.Fatalf("round trip: %+v %q %v", got, inline, err)
	}
	// Written by the build before this one: job "v2", queued, request
	// path /x, payload {"n":2}.
	v2, _ := hex.DecodeString("02010461636d65000000000000000000000000000000000d7b2270617468223a222f78227d01077b226e223a327d")
	old, inline, err := decodeJob(v2, "v2")
	if err != nil || old.State != queue.StateQueued || old.Type != "" || old.Request == nil || old.Request.Path != "/x" || string(inline) != `{"n":2}` {
		t.Fatalf("version 2 record: %+v %q %v", old, inline, err)
	}
}
