package leaky

import (
	"testing"
	"time"
)

func at(d time.Duration) time.Time { return t0.Add(d) }

// A 429 at 250 ms for the job of slot 200 ms with Retry-After 2 s: tenant
// time stands at 200 ms until 2.25 s, then runs again, and the queued slots
// follow the pushed-back job one interval apart.
func TestPauseKeepsOrderAndSpacing(t *testing.T) {
	t.Parallel()
	const T = 100 * time.Millisecond
	var p Pause
	if !p.TenantTime(at(time.Second)).Equal(at(time.Second)) {
		t.Fatal("an unpaused tenant's time is real time")
	}
	p = p.PauseUntil(at(250*time.Millisecond), at(2250*time.Millisecond), at(200*time.Millisecond))
	for _, now := range []time.Duration{250 * time.Millisecond, time.Second, 2249 * time.Millisecond} {
		if got := p.TenantTime(at(now)); !got.Equal(at(200 * time.Millisecond)) {
			t.Fatalf("tenant time at %v = %v, want it to stand at 200ms", now, got.Sub(t0))
		}
		if paused, until := p.Paused(at(now)); !paused || !until.Equal(at(2250*time.Millisecond)) {
			t.Fatalf("Paused at %v = %v %v", now, paused, until)
		}
	}
	if got := p.TenantTime(at(3 * time.Second)); !got.Equal(at(950 * time.Millisecond)) {
		t.Fatalf("tenant time after the pause = %v, want 950ms", got.Sub(t0))
	}
	for i, slot := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond} {
		real, ok := p.Real(at(slot))
		if want := at(2250*time.Millisecond + time.Duration(i)*T); !ok || !real.Equal(want) {
			t.Fatalf("slot %v goes at %v, want %v", slot, real.Sub(t0), want.Sub(t0))
		}
	}
	// A slot that passed before the pause goes when it ends, not before.
	if real, _ := p.Real(at(50 * time.Millisecond)); !real.Equal(at(2250 * time.Millisecond)) {
		t.Fatalf("an old slot goes at %v", real.Sub(t0))
	}
	if paused, _ := p.Paused(at(2250 * time.Millisecond)); paused {
		t.Fatal("still paused when the pause ended")
	}
}

// Two answers of the same burst both ask for a pause: the clock never jumps
// forward, the later end wins, and the earliest pushed-back slot goes first.
func TestPausesCombine(t *testing.T) {
	t.Parallel()
	var p Pause
	p = p.PauseUntil(at(100*time.Millisecond), at(time.Second), at(100*time.Millisecond))
	p = p.PauseUntil(at(150*time.Millisecond), at(800*time.Millisecond), at(50*time.Millisecond))
	if got := p.TenantTime(at(500 * time.Millisecond)); !got.Equal(at(50 * time.Millisecond)) {
		t.Fatalf("tenant time %v, want 50ms", got.Sub(t0))
	}
	if _, until := p.Paused(at(500 * time.Millisecond)); !until.Equal(at(time.Second)) {
		t.Fatalf("paused until %v", until.Sub(t0))
	}
	// A pause that ends in the past changes nothing.
	if q := p.PauseUntil(at(2*time.Second), at(time.Second), time.Time{}); q != p {
		t.Fatal("a pause ending in the past changed the clock")
	}
	// Nothing moves tenant time forward.
	prev := p.TenantTime(at(0))
	for now := time.Duration(0); now < 3*time.Second; now += 10 * time.Millisecond {
		got := p.TenantTime(at(now))
		if got.Before(prev) {
			t.Fatalf("tenant time went back at %v", now)
		}
		prev = got
	}
}

// An operator hold has no end: nothing is due until Resume, which restarts
// tenant time where it stood, also when the hold came during a timed pause.
func TestHoldAndResume(t *testing.T) {
	t.Parallel()
	var p Pause
	p = p.Hold(at(time.Second))
	if _, ok := p.Real(at(2 * time.Second)); ok {
		t.Fatal("a held tenant has a dispatch time")
	}
	if paused, until := p.Paused(at(time.Hour)); !paused || !until.IsZero() {
		t.Fatalf("Paused = %v %v, want held with no end", paused, until)
	}
	if got := p.TenantTime(at(time.Hour)); !got.Equal(at(time.Second)) {
		t.Fatalf("tenant time during the hold = %v", got.Sub(t0))
	}
	p = p.Resume(at(10 * time.Second))
	if got := p.TenantTime(at(11 * time.Second)); !got.Equal(at(2 * time.Second)) {
		t.Fatalf("tenant time 1s after resume = %v, want 2s", got.Sub(t0))
	}
	if real, _ := p.Real(at(1500 * time.Millisecond)); !real.Equal(at(10500 * time.Millisecond)) {
		t.Fatalf("slot 1.5s goes at %v, want 10.5s", real.Sub(t0))
	}

	// Held during a pause that outlasts the hold: the pause still runs out.
	var q Pause
	q = q.PauseUntil(at(0), at(5*time.Second), at(0))
	q = q.Hold(at(time.Second)).Resume(at(2 * time.Second))
	if paused, until := q.Paused(at(3 * time.Second)); !paused || !until.Equal(at(5*time.Second)) {
		t.Fatalf("after resume inside a pause: %v %v", paused, until)
	}
	if got := q.TenantTime(at(6 * time.Second)); !got.Equal(at(time.Second)) {
		t.Fatalf("tenant time = %v, want 1s", got.Sub(t0))
	}
	if r := q.Resume(at(7 * time.Second)); r != q {
		t.Fatal("resume without a hold changed the clock")
	}
}
