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

// AfterAt waits for an instant: the clock moving between the caller's
// reading and its wait does not move the wake.
func TestAfterAtFiresAtTheInstant(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	wake := f.Now().Add(50 * time.Millisecond)
	f.Advance(30 * time.Millisecond) // the caller took this long
	ch := AfterAt(f, wake)
	if at, ok := f.Next(); !ok || !at.Equal(wake) {
		t.Fatalf("Next %v %v, want the instant asked for, t0+50ms", at, ok)
	}
	f.Advance(20 * time.Millisecond)
	select {
	case <-ch:
	default:
		t.Fatal("not fired with the clock at its instant")
	}
	select {
	case <-AfterAt(f, t0): // passed already: at once
	default:
		t.Fatal("an instant already passed did not fire at once")
	}
	// A clock that cannot wait for an instant waits what is left of it.
	real := AfterAt(Real{}, time.Now().Add(-time.Second))
	select {
	case <-real:
	case <-time.After(time.Second):
		t.Fatal("Real: an instant already passed did not fire at once")
	}
}
