package dispatch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// The rate limit fields vendors send, in each style, read as the room
// they leave: none left and until when, or room (or nothing readable).
func TestAnnouncedRoomIsRead(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	for _, c := range []struct {
		name   string
		style  string
		fields map[string]string
		wait   time.Duration
		none   bool // no room left
	}{
		{"ietf list, none left", AnnounceIETF, map[string]string{"RateLimit": `"default";r=0;t=30`}, 30 * time.Second, true},
		{"ietf list, room", AnnounceIETF, map[string]string{"RateLimit": `"default";r=4;t=30`}, 0, false},
		{"ietf list, the quota out of room wins", AnnounceIETF, map[string]string{"RateLimit": `"burst";r=3;t=1, "day";r=0;t=3600`}, time.Hour, true},
		{"ietf list, two out: the longer", AnnounceIETF, map[string]string{"RateLimit": `"a";r=0;t=2, "b";r=0;t=5`}, 5 * time.Second, true},
		{"ietf list, a name with a comma", AnnounceIETF, map[string]string{"RateLimit": `"a,b;c";r=0;t=7`}, 7 * time.Second, true},
		{"ietf list, no reset said", AnnounceIETF, map[string]string{"RateLimit": `"default";r=0`}, 0, false},
		{"ietf dictionary (drafts 04-07)", AnnounceIETF, map[string]string{"RateLimit": `limit=10, remaining=0, reset=12`}, 12 * time.Second, true},
		{"ietf dictionary, room", AnnounceIETF, map[string]string{"RateLimit": `limit=10, remaining=2, reset=12`}, 0, false},
		{"ietf fields (drafts 00-03)", AnnounceIETF, map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "3"}, 3 * time.Second, true},
		{"ietf, a reset now", AnnounceIETF, map[string]string{"RateLimit": `"default";r=0;t=0`}, 0, true},
		{"ietf, garbage", AnnounceIETF, map[string]string{"RateLimit": `;;=,"`}, 0, false},
		{"ietf read as x-ratelimit: nothing", AnnounceXRate, map[string]string{"RateLimit": `"default";r=0;t=30`}, 0, false},
		{"x, reset in seconds", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"}, 20 * time.Second, true},
		{"x, reset as Unix seconds (GitHub)", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(90 * time.Second)}, 90 * time.Second, true},
		{"x, reset passed", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(-time.Minute)}, 0, true},
		{"x, reset-after with fractions (Discord)", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "0.25", "X-RateLimit-Reset": epoch(time.Hour)}, 250 * time.Millisecond, true},
		{"x, room", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "20"}, 0, false},
		{"x, no reset", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0"}, 0, false},
		{"x, reset in Unix milliseconds: unreadable", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1772366400000"}, 0, false},
		{"x, negative", AnnounceXRate, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-5"}, 0, false},
		{"off reads nothing", AnnounceOff, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20", "RateLimit": `"d";r=0;t=9`}, 0, false},
		{"no style reads nothing", "", map[string]string{"RateLimit": `"d";r=0;t=9`}, 0, false},
	} {
		h := http.Header{}
		for k, v := range c.fields {
			h.Set(k, v)
		}
		wait, none := exhausted(h, c.style, now)
		if none != c.none || wait != c.wait {
			t.Errorf("%s: %v %v, want %v %v", c.name, wait, none, c.wait, c.none)
		}
	}
}

// Whatever a vendor sends, the reading never panics, never gives a
// negative wait, and says "none left" only when a remaining count of 0 is
// there to be read.
func FuzzAnnounced(f *testing.F) {
	for _, seed := range [][3]string{
		{`"default";r=0;t=30`, "", ""},
		{`limit=10, remaining=0, reset=12`, "0", "3"},
		{`"a";r=0;t=2, "b";r=1;t=5`, "0", "1767225600"},
		{`"x\"y";r=0;t=1`, "1", "0.5"},
		{"", "0", "-1"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ratelimit, remaining, reset string) {
		for _, style := range []string{AnnounceIETF, AnnounceXRate, AnnounceOff} {
			h := http.Header{}
			h.Set("RateLimit", ratelimit)
			h.Set("RateLimit-Remaining", remaining)
			h.Set("RateLimit-Reset", reset)
			h.Set("X-RateLimit-Remaining", remaining)
			h.Set("X-RateLimit-Reset", reset)
			wait, none := exhausted(h, style, now)
			if wait < 0 || (!none && wait != 0) {
				t.Fatalf("%s %q %q %q: %v %v", style, ratelimit, remaining, reset, wait, none)
			}
			if style == AnnounceOff && none {
				t.Fatalf("off read %q as none left", ratelimit)
			}
			if style == AnnounceXRate && none {
				if n, err := strconv.ParseInt(strings.TrimSpace(remaining), 10, 64); err != nil || n != 0 {
					t.Fatalf("x-ratelimit: none left with X-RateLimit-Remaining %q", remaining)
				}
			}
		}
	})
}

// A hold an announcement asks for is bounded by the route's
// max_hold (and says so), and lasts at least one interval of
// the tenant's rate: a reset now must not mean "again at once, and again".
func TestAnnouncedHoldIsBounded(t *testing.T) {
	r := Route{Policy: leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1}, MaxHold: time.Minute}
	for _, c := range []struct {
		said, want time.Duration
		capped     bool
	}{
		{30 * time.Second, 30 * time.Second, false},
		{2 * time.Hour, time.Minute, true},
		{0, 100 * time.Millisecond, false},
	} {
		wait, capped, ok := announcedWait(r, &answer{exhausted: true, wait: c.said})
		if !ok || wait != c.want || capped != c.capped {
			t.Errorf("reset in %v: %v capped %v (%v), want %v capped %v", c.said, wait, capped, ok, c.want, c.capped)
		}
	}
	if _, _, ok := announcedWait(r, &answer{wait: time.Second}); ok {
		t.Error("an answer with room left held its tenant")
	}
}

// What an answer that says no room is left holds: its tenant (and, with
// the downstream scope, every tenant of the downstream), whatever its
// status; a 429 without Retry-After waits for the announced reset; a 503
// without Retry-After stays a failure.
func TestAnnouncedRoomHoldsItsScope(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		status     int
		downstream bool
		result     queue.Result
		pause      bool // the answered job itself waits for the reset, not a backoff
	}{
		{"200, tenant", 200, false, queue.Succeeded, false},
		{"200, downstream", 200, true, queue.Succeeded, false},
		{"429 without Retry-After, downstream", 429, true, queue.Retry, true},
		{"503 without Retry-After, tenant", 503, false, queue.Retry, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(&recorder{answer: func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Throttler-Tenant") == "acme" {
					w.Header().Set("X-RateLimit-Remaining", "0")
					w.Header().Set("X-RateLimit-Reset-After", "3")
					w.WriteHeader(c.status)
					return
				}
				w.WriteHeader(200)
			}})
			defer srv.Close()
			d := newDispatcher(t, srv.URL, Route{Announce: AnnounceXRate, AnnounceDownstream: c.downstream, MaxHold: time.Hour})
			before := time.Now()
			out := d.Handle(context.Background(), job(jobID, 1, before))
			if out.Result != c.result || (!out.PauseUntil.IsZero()) != c.pause {
				t.Fatalf("the answered job: %+v, want result %v, paused %v", out, c.result, c.pause)
			}
			if c.pause && out.PauseUntil.Sub(before) < 2900*time.Millisecond {
				t.Fatalf("a 429 announcing a reset in 3 s paused until %v from now", out.PauseUntil.Sub(before))
			}
			next := job("01knb4s3vq5m8h7xkq2d9e4c1b", 1, time.Now())
			if o := d.Handle(context.Background(), next); o.Result != queue.Released || o.PauseUntil.Sub(before) < 2900*time.Millisecond {
				t.Fatalf("the tenant's next job: %+v, want it back in line until the reset", o)
			}
			other := job("01knb4s3vq5m8h7xkq2d9e4c1c", 1, time.Now())
			other.Tenant = "other"
			o := d.Handle(context.Background(), other)
			if c.downstream && (o.Result != queue.Released || o.PauseUntil.Sub(before) < 2900*time.Millisecond) {
				t.Fatalf("another tenant, the downstream held: %+v, want it back in line until the reset", o)
			}
			if !c.downstream && o.Result != queue.Succeeded {
				t.Fatalf("another tenant, the tenant alone held: %+v, want it sent", o)
			}
		})
	}
}
