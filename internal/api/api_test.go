package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
)

func TestStoreDownIs503AndSaysSo(t *testing.T) {
	t.Parallel()
	h, store := newAPI(t)
	store.Close()
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/tenants/acme/jobs", `{"payload":1}`},
		{"GET", "/v1/jobs/0000000000000000000000000a", ""},
		{"GET", "/readyz", ""},
	} {
		st, hdr, body := do(t, h, c.method, c.path, c.body)
		if st != http.StatusServiceUnavailable || body["error"] != "store_unavailable" {
			t.Errorf("%s %s: %d %v", c.method, c.path, st, body)
		}
		if c.path != "/readyz" && hdr.Get("Retry-After") == "" {
			t.Errorf("%s %s: no Retry-After", c.method, c.path)
		}
	}
	if st, _, _ := do(t, h, "GET", "/healthz", ""); st != 200 {
		t.Errorf("healthz with the store down: %d (the process is up)", st)
	}
}

func TestRetryAfterRoundsUp(t *testing.T) {
	t.Parallel()
	for ms, want := range map[int64]int64{1: 1, 999: 1, 1000: 1, 1001: 2, 61500: 62} {
		if got := retryAfterSeconds(timeMS(ms)); got != want {
			t.Errorf("%d ms -> %d s, want %d", ms, got, want)
		}
	}
	if ceilMillis(1) != 1 || ceilMillis(0) != 0 || ceilMillis(timeMS(5)) != 5 {
		t.Error("ceilMillis")
	}
}

func FuzzDecodeJob(f *testing.F) {
	for _, s := range []string{
		`{"payload":{"to":"+1555","text":"hi"}}`,
		`{"payload":1,"idempotency_key":"k"}`,
		`{"payload":null}`,
		`{"payload":"x"} trailing`,
		`{"deadline":"2026-01-01T00:00:00Z","payload":1}`,
		`[`, ``, `{"payload":1,"payload":2}`,
	} {
		f.Add(s, "")
	}
	f.Add(`{"payload":true}`, "hdr-key")
	s := &server{clock: clock.Real{}}
	f.Fuzz(func(t *testing.T, body, headerKey string) {
		var req jobRequest
		err := decode(strings.NewReader(body), &req)
		// A job's body is read once: as decode's generic decoder, which
		// reads the value and hands it to UnmarshalJSON, reads it (the job
		// inside another type), the same job or the same error.
		var twice struct{ jobRequest }
		errTwice := decode(strings.NewReader(body), &twice)
		if fmt.Sprint(err) != fmt.Sprint(errTwice) || (err == nil && !reflect.DeepEqual(req, twice.jobRequest)) {
			t.Fatalf("body %q: read once %+v (%v), read by a decoder %+v (%v)", body, req, err, twice.jobRequest, errTwice)
		}
		if err == nil {
			var nj queue.NewJob
			nj, err = s.validate("t", req, headerKey, 1<<10, "", false)
			if err == nil {
				// What is accepted is one valid JSON value, and the key is sane.
				if !json.Valid(nj.Payload) || bytes.Equal(nj.Payload, []byte("null")) || !validKey(nj.IdempotencyKey) {
					t.Fatalf("accepted payload %q key %q", nj.Payload, nj.IdempotencyKey)
				}
				return
			}
		}
		var late *queue.ImpossibleError
		if errors.As(err, &late) && late.Reason == queue.ReasonWouldExpire {
			return // a deadline already passed: 422, the job's answer
		}
		var ae *apiError
		if !errors.As(err, &ae) || (ae.status != 400 && ae.status != 413) || ae.code == "" || ae.message == "" {
			t.Fatalf("body %q: error %v is not a 400/413 with a code and message", body, err)
		}
	})
}

func FuzzTenantName(f *testing.F) {
	for _, s := range []string{"acme", "+15551234567", "a b", "..", "ä", "user@example.com"} {
		f.Add(s)
	}
	h, _ := newAPIForFuzz(f)
	f.Fuzz(func(t *testing.T, name string) {
		st, _, body := do(t, h, "GET", "/v1/tenants/"+urlPathEscape(name), "")
		if config.ValidName(name) {
			if st != 200 || body["tenant"] != name {
				t.Fatalf("valid name %q: %d %v", name, st, body)
			}
			return
		}
		if st != 400 && st != 404 && st != 301 && st != 307 {
			t.Fatalf("invalid name %q: status %d %v", name, st, body)
		}
	})
}
