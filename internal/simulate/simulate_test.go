package simulate

import (
	"strings"
	"testing"
	"time"
)

var limit = NewLimit(time.Second, 10, 10) // 1/s, burst 10, capacity 10

func byName(t *testing.T, results []Result, name string) Result {
	t.Helper()
	for _, r := range results {
		if r.Algorithm == name {
			return r
		}
	}
	t.Fatalf("no %q in the results", name)
	return Result{}
}

// At a window's edge, the fixed window lets about twice the limit through
// in one second; the sliding windows and both buckets do not.
func TestWindowEdge(t *testing.T) {
	t.Parallel()
	arrivals, _ := Scenario("window-edge", limit)
	results := Run(limit, arrivals)
	if got := byName(t, results, "fixed window").MaxPerSecond; got != 2*limit.Burst {
		t.Fatalf("fixed window: %d in one second, want %d", got, 2*limit.Burst)
	}
	for _, name := range []string{"sliding window (log)", "sliding window (counter)", "token bucket", "leaky bucket (queue)"} {
		if r := byName(t, results, name); r.MaxPerSecond > limit.Burst || r.MaxInWindow > limit.Burst {
			t.Fatalf("%s: %d in a second, %d in a window; want at most %d", name, r.MaxPerSecond, r.MaxInWindow, limit.Burst)
		}
	}
}

// A burst after a quiet spell: the leaky bucket takes capacity + 1 (one
// goes now, capacity wait), the token bucket takes burst.
func TestBurst(t *testing.T) {
	t.Parallel()
	arrivals, _ := Scenario("burst", limit)
	results := Run(limit, arrivals)
	if r := byName(t, results, "leaky bucket (queue)"); r.Accepted != 11 || r.MaxWait != 10*time.Second || r.MaxPerSecond != 1 {
		t.Fatalf("leaky: %+v", r)
	}
	if r := byName(t, results, "token bucket"); r.Accepted != 10 || r.MaxWait != 0 {
		t.Fatalf("token: %+v", r)
	}
}

// Honouring Retry-After with jitter costs far fewer attempts than retrying
// at once, and lets no more through.
func TestRetryStorm(t *testing.T) {
	t.Parallel()
	arrivals, _ := Scenario("retry-storm", limit)
	atOnce := Storm(limit, arrivals, AtOnce, 1)
	honour := Storm(limit, arrivals, HonourRetryAfter, 1)
	for i := range atOnce {
		a, h := atOnce[i], honour[i]
		factor := float64(a.Attempts) / float64(h.Attempts)
		t.Logf("%-26s %6d attempts at once, %5d honouring Retry-After: %.1fx fewer", a.Algorithm, a.Attempts, h.Attempts, factor)
		if factor < 5 {
			t.Fatalf("%s: honouring Retry-After saves only %.1fx", a.Algorithm, factor)
		}
		if a.Accepted != len(arrivals) || h.Accepted != len(arrivals) {
			t.Fatalf("%s: %d and %d of %d clients got in", a.Algorithm, a.Accepted, h.Accepted, len(arrivals))
		}
	}
	// The same seed gives the same run.
	again := Storm(limit, arrivals, HonourRetryAfter, 1)
	if again[0].Attempts != honour[0].Attempts {
		t.Fatal("a storm with the same seed differs")
	}
}

// Every algorithm's Retry-After is honest: an arrival exactly then is
// accepted (for the sliding counter, an approximation, at most a window).
func TestRetryAfterIsWhenItWouldBeAccepted(t *testing.T) {
	t.Parallel()
	arrivals, _ := Scenario("slightly-too-fast", limit)
	for i, a := range Algorithms(limit) {
		for _, at := range arrivals {
			ok, _, ra := a.Offer(at)
			if ok {
				continue
			}
			probe := Algorithms(limit)[i]
			for _, earlier := range arrivals {
				if earlier <= at {
					probe.Offer(earlier) // same history (the refused one changes nothing)
				}
			}
			if ok, _, _ := probe.Offer(at + ra); !ok {
				t.Fatalf("%s: refused at %v with Retry-After %v, and refused again then", a.Name(), at, ra)
			}
			break
		}
	}
}

func TestParseTrace(t *testing.T) {
	t.Parallel()
	got, err := ParseTrace(strings.NewReader("seconds,tenant\n0\n# a comment\n\n0.5,acme\n 1.25 \n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 500 * time.Millisecond, 1250 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for text, msg := range map[string]string{"0\nabc\n": "line 2", "-1\n": "from 0", "": "no arrival", "1\nNaN\n": "line 2"} {
		if _, err := ParseTrace(strings.NewReader(text)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%q: %v, want an error with %q", text, err, msg)
		}
	}
}

func FuzzParseTrace(f *testing.F) {
	for _, s := range []string{"0\n1\n2\n", "t\n0.5,x\n", "# c\n\n3.25\n", "1e3\n", "abc\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTrace(strings.NewReader(s))
		if err != nil {
			return
		}
		if len(got) == 0 {
			t.Fatal("no arrivals and no error")
		}
		for _, at := range got {
			if at < 0 || at > 366*24*time.Hour {
				t.Fatalf("arrival %v out of range", at)
			}
		}
		// Whatever parses, simulates.
		Run(NewLimit(time.Second, 3, 2), got[:min(len(got), 200)])
	})
}
