package clock

import (
	"testing"
	"time"
)

// Next says when the earliest unfired After is due, and moves on as
// Advance fires them.
func TestFakeNext(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	if at, ok := f.Next(); ok {
		t.Fatalf("no waiters, Next %v", at)
	}
	f.After(3 * time.Second)
	f.After(time.Second)
	f.After(0) // fires at once: never waits
	if at, ok := f.Next(); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("Next %v %v, want t0+1s", at, ok)
	}
	f.Advance(2 * time.Second)
	if at, ok := f.Next(); !ok || !at.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("after 2s Next %v %v, want t0+3s", at, ok)
	}
	f.Advance(time.Second)
	if at, ok := f.Next(); ok || f.Waiters() != 0 {
		t.Fatalf("all fired, Next %v, %d waiters", at, f.Waiters())
	}
}
