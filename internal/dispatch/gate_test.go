package dispatch

import (
	"context"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// wait runs g.Wait in the background and returns its ticket channel.
func wait(g *Gate, key string, p leaky.Policy, notBefore time.Time) <-chan *Ticket {
	ch := make(chan *Ticket, 1)
	go func() {
		t, _ := g.Wait(context.Background(), key, p, notBefore)
		ch <- t
	}()
	return ch
}

func expectNone(t *testing.T, ch <-chan *Ticket) {
	t.Helper()
	select {
	case tk := <-ch:
		t.Fatalf("released at %v, want still waiting", tk.At.Sub(t0))
	case <-time.After(20 * time.Millisecond):
	}
}

func expectAt(t *testing.T, ch <-chan *Ticket, want time.Duration) *Ticket {
	t.Helper()
	select {
	case tk := <-ch:
		if tk.At.Sub(t0) != want {
			t.Fatalf("released at %v, want %v", tk.At.Sub(t0), want)
		}
		return tk
	case <-time.After(5 * time.Second):
		t.Fatalf("not released, want at %v", want)
	}
	return nil
}

const half = 1500 * time.Microsecond // the gate's slack at these rates

func TestGateHoldsBackALateSendsSuccessor(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	// The first job's slot is t0 but its connection took 30 ms.
	clk.Advance(30 * time.Millisecond)
	expectAt(t, wait(g, "a", p, t0), 30*time.Millisecond).Wrote(clk.Now())
	// The second job's slot is t0+T: it must wait for first send + T - slack.
	second := wait(g, "a", p, t0.Add(T))
	waitWaiters(t, clk, 1)
	clk.Set(t0.Add(T))
	expectNone(t, second)
	clk.Set(t0.Add(30*time.Millisecond + T - half))
	expectAt(t, second, 30*time.Millisecond+T-half).Done()
	// Another tenant is not held back at all.
	expectAt(t, wait(g, "b", p, t0), 30*time.Millisecond+T-half).Done()
}

func TestGateLetsABurstThrough(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 3}
	for i := 0; i < 3; i++ {
		expectAt(t, wait(g, "a", p, t0), 0).Wrote(t0)
	}
	fourth := wait(g, "a", p, t0)
	waitWaiters(t, clk, 1)
	expectNone(t, fourth)
	clk.Set(t0.Add(T - half))
	expectAt(t, fourth, T-half).Done()
}

// A send is spaced from when the one before it was really written, and does
// not go at all until that is known.
func TestGateSpacesFromTheRealWrite(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	first := expectAt(t, wait(g, "a", p, t0), 0)
	// The first request is not written yet at the second one's slot.
	clk.Set(t0.Add(T))
	next := wait(g, "a", p, t0.Add(T))
	expectNone(t, next)
	// It is written 150 ms late: the second waits for that + T.
	clk.Set(t0.Add(150 * time.Millisecond))
	first.Wrote(clk.Now())
	waitWaiters(t, clk, 1)
	expectNone(t, next)
	clk.Set(t0.Add(250*time.Millisecond - half))
	expectAt(t, next, 250*time.Millisecond-half).Done()
}

// An attempt that wrote nothing frees the gate without moving it.
func TestGateDoneWithoutWrite(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	p := leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1}
	first := expectAt(t, wait(g, "a", p, t0), 0)
	clk.Set(t0.Add(100 * time.Millisecond))
	next := wait(g, "a", p, t0.Add(100*time.Millisecond))
	expectNone(t, next)
	first.Done()
	expectAt(t, next, 100*time.Millisecond).Done()
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
			case tk := <-ch:
				// Written a pseudo-random 0-0.4 ms after release.
				w := tk.At.Add(time.Duration(i*31%5) * 100 * time.Microsecond)
				clk.Set(w)
				tk.Wrote(w)
				sends = append(sends, w)
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
			if n := j - i + 1; float64(n) > float64(w+half)/float64(T)+1 {
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
