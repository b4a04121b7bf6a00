package testutil

import (
	"testing"
	"time"
)

// Within sums the stalls that overlap the interval, whole, and no others.
func TestStallsWithin(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := &Stalls{}
	s.add(at(100), at(120)) // 20 ms
	s.add(at(500), at(570)) // 70 ms
	for _, c := range []struct {
		from, to int
		want     time.Duration
	}{
		{0, 100, 0},                         // ends as the first begins
		{0, 101, 20 * time.Millisecond},     // overlaps its start
		{110, 115, 20 * time.Millisecond},   // inside it
		{120, 500, 0},                       // between them
		{119, 501, 90 * time.Millisecond},   // both
		{0, 1000, 90 * time.Millisecond},    // around both
		{569, 10000, 70 * time.Millisecond}, // the second's end
		{570, 10000, 0},                     // after both
	} {
		if got := s.Within(at(c.from), at(c.to)); got != c.want {
			t.Errorf("Within(+%d ms, +%d ms) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
	if w := s.Worst(); w != 70*time.Millisecond {
		t.Errorf("Worst = %v, want 70ms", w)
	}
}
