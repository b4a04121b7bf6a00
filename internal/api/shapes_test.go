package api

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// The admission answer written without reflection is the one encoding/json
// writes for admissionJSON, byte for byte, and the same fallback otherwise.
func TestWriteAdmissionIsEncodingJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	cases := []queue.Admission{
		{Job: queue.Job{ID: queue.NewID(at), Tenant: "acme", State: queue.StateQueued, DispatchAt: at}, ExpectedDelay: 1500 * time.Microsecond, QueueDepth: 3, Capacity: 10},
		{Job: queue.Job{ID: "x", Tenant: "a.b_c-d+e@f", State: queue.StateQueued, DispatchAt: at.Truncate(time.Second)}, Capacity: 1},
		{Job: queue.Job{ID: "y", Tenant: "t", State: queue.StateDispatching, EnqueuedAt: at, AdmitDelay: time.Second, DispatchAt: at.Add(time.Hour)}, Duplicate: true, ExpectedDelay: time.Second},
		{Job: queue.Job{ID: "z", Tenant: "a<b>&\"\\\u2028é", State: queue.StateQueued}, QueueDepth: -1},
		{Job: queue.Job{ID: "w", Tenant: "t", DispatchAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}},
		{},
	}
	for i, a := range cases {
		want := httptest.NewRecorder()
		writeJSON(want, 202, admissionJSON(a))
		got := httptest.NewRecorder()
		writeAdmission(got, 202, a)
		if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) || got.Code != want.Code || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
			t.Errorf("case %d:\n got %d %q\nwant %d %q", i, got.Code, got.Body.Bytes(), want.Code, want.Body.Bytes())
		}
		if want.Body.Len() > 0 && !json.Valid(want.Body.Bytes()) {
			t.Errorf("case %d: not JSON: %q", i, want.Body.Bytes())
		}
	}
}
