package fakegateway

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/throttler-dev/throttler/internal/leaky"
)

func TestRefusesPastItsLimit(t *testing.T) {
	t.Parallel()
	r := leaky.MustParseRate("1/h")
	g := New(&r, 2, 200, nil)
	var codes []int
	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest("POST", "/", nil))
		codes = append(codes, rec.Code)
		if rec.Code == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 || g.Refused.Load() != 1 || g.Accepted.Load() != 2 {
		t.Fatalf("codes %v", codes)
	}
}
