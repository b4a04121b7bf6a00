package dispatch

import (
	"context"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// wait runs g.Wait in the background and returns its result channel.
func wait(g *Gate, key string, p leaky.Policy, notBefore time.Time) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		at, _ := g.Wait(context.Background(), key, p, notBefore)
		ch <- at
	}()
	return ch
}

func expectNone(t *testing.T, ch <-chan time.Time) {
	t.Helper()
	select {
	case at := <-ch:
		t.Fatalf("released at %v, want still waiting", at.Sub(t0))
	case <-time.After(20 * time.Millisecond):
	}
}

func expectAt(t *testing.T, ch <-chan time.Time, want time.Duration) {
	t.Helper()
	select {
	case at := <-ch:
		if at.Sub(t0) != want {
			t.Fatalf("released at %v, want %v", at.Sub(t0), want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("not released, want at %v", want)
	}
}

func TestGateHoldsBackALateSendsSuccessor(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	// The first job's slot is t0 but its connection took 30 ms.
	clk.Advance(30 * time.Millisecond)
	expectAt(t, wait(g, "a", p, t0), 30*time.Millisecond)
	// The second job's slot is t0+T: it must wait for first send + T - slack.
	second := wait(g, "a", p, t0.Add(T))
	waitWaiters(t, clk, 1)
	clk.Set(t0.Add(T))
	expectNone(t, second)
	clk.Set(t0.Add(30*time.Millisecond + T - 500*time.Microsecond))
	expectAt(t, second, 30*time.Millisecond+T-500*time.Microsecond)
	// Another tenant is not held back at all.
	expectAt(t, wait(g, "b", p, t0), 30*time.Millisecond+T-500*time.Microsecond)
}

func TestGateLetsABurstThrough(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 3}
	for i := 0; i < 3; i++ {
		expectAt(t, wait(g, "a", p, t0), 0)
	}
	fourth := wait(g, "a", p, t0)
	waitWaiters(t, clk, 1)
	expectNone(t, fourth)
	clk.Set(t0.Add(T - 500*time.Microsecond))
	expectAt(t, fourth, T-500*time.Microsecond)
}

// Sends that the gate releases obey the window rule of DESIGN.md invariant 1
// with room to spare: at most (W + 0.5ms)/T + burst in any window W,
// whatever the lateness.
func TestGateWindowRuleUnderJitter(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 20 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	var sends []time.Time
	for i := 0; i < 300; i++ {
		// Each job arrives at its slot plus a pseudo-random lateness of 0-3 ms.
		slot := t0.Add(time.Duration(i) * T)
		late := time.Duration(i*7919%31) * 100 * time.Microsecond
		if now := clk.Now(); now.Before(slot.Add(late)) {
			clk.Set(slot.Add(late))
		}
		ch := wait(g, "a", p, slot)
		for {
			select {
			case at := <-ch:
				sends = append(sends, at)
			case <-time.After(time.Millisecond):
				clk.Advance(100 * time.Microsecond)
				continue
			}
			break
		}
	}
	for i := range sends {
		for j := i + 1; j < len(sends); j++ {
			w := sends[j].Sub(sends[i])
			if n := j - i + 1; float64(n) > float64(w+500*time.Microsecond)/float64(T)+1 {
				t.Fatalf("%d sends within %v", n, w)
			}
		}
	}
}

func waitWaiters(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clk.Waiters() < n {
		if time.Now().After(deadline) {
			t.Fatalf("want %d waiters, have %d", n, clk.Waiters())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestGateSpacesFromALateWrite(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	expectAt(t, wait(g, "a", p, t0), 0)
	// The request was really written 3 ms after the gate let it go.
	g.Late("a", p, t0.Add(3*time.Millisecond))
	next := wait(g, "a", p, t0.Add(T))
	waitWaiters(t, clk, 1)
	clk.Set(t0.Add(T))
	expectNone(t, next)
	clk.Set(t0.Add(T + 3*time.Millisecond - 500*time.Microsecond))
	expectAt(t, next, T+3*time.Millisecond-500*time.Microsecond)
}
