package leaky

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// EarliestAmong against the definition, on whole milliseconds: the first
// t >= at such that no window (s-Length, s] with s in [t, t+Length) holds
// more than N with the new sends.
func TestEarliestAmongIsTheFirstFit(t *testing.T) {
	base := time.Unix(1000, 0)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	rng := rand.New(rand.NewPCG(7, 11))
	ahead := 0
	for run := range 3000 {
		w := Window{N: 1 + rng.IntN(5), Length: time.Duration(5+rng.IntN(30)) * time.Millisecond}
		var sends []time.Time
		for range rng.IntN(12) {
			sends = append(sends, ms(rng.IntN(100)))
		}
		slices.SortFunc(sends, time.Time.Compare)
		at, cost := ms(rng.IntN(100)), 1+rng.IntN(w.N)
		count := func(s time.Time) int {
			n := 0
			for _, e := range sends {
				if e.After(s.Add(-w.Length)) && !e.After(s) {
					n++
				}
			}
			return n
		}
		fits := func(t time.Time) bool {
			for s := t; s.Before(t.Add(w.Length)); s = s.Add(time.Millisecond) {
				if count(s)+cost > w.N {
					return false
				}
			}
			return true
		}
		want := at
		for !fits(want) {
			want = want.Add(time.Millisecond)
		}
		if got := EarliestAmong(sends, w, at, cost); !got.Equal(want) {
			t.Fatalf("run %d: %d/%v, sends %v, at %v, cost %d: got %v, want %v", run, w.N, w.Length,
				offsets(base, sends), at.Sub(base), cost, got.Sub(base), want.Sub(base))
		}
		if len(sends) > 0 && sends[len(sends)-1].After(at) {
			ahead++
		}
	}
	if ahead < 1000 {
		t.Fatalf("only %d runs had a send after at", ahead)
	}
}

// With every send at or before at it is Recent.Earliest on the newest N.
func TestEarliestAmongIsEarliestForSendsBefore(t *testing.T) {
	base := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(3, 5))
	for run := range 2000 {
		w := Window{N: 1 + rng.IntN(6), Length: time.Duration(10+rng.IntN(50)) * time.Millisecond}
		var r Recent
		for range rng.IntN(10) {
			r = r.Add(w, base.Add(time.Duration(rng.IntN(80))*time.Millisecond), 1)
		}
		at := base.Add(time.Duration(80+rng.IntN(40)) * time.Millisecond)
		cost := 1 + rng.IntN(w.N)
		if got, want := EarliestAmong(r, w, at, cost), r.Earliest(w, at, cost); !got.Equal(want) {
			t.Fatalf("run %d: got %v, want %v", run, got.Sub(base), want.Sub(base))
		}
	}
}

func offsets(base time.Time, ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(base)
	}
	return out
}
