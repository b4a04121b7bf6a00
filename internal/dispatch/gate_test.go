package dispatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/testutil"
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

// expectStillWaitingAfter20ms watches ch for 20 ms of real time and fails
// if a ticket comes: a check that nothing happens, not a wait for something.
func expectStillWaitingAfter20ms(t *testing.T, ch <-chan *Ticket) {
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

// fakeGate is a gate on a fake clock at t0.
func fakeGate() (*clock.Fake, *Gate) {
	clk := clock.NewFake(t0)
	return clk, NewGate(clk)
}

func TestGateHoldsBackALateSendsSuccessor(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	// The first job's slot is t0 but its connection took 30 ms.
	clk.Advance(30 * time.Millisecond)
	expectAt(t, wait(g, "a", p, t0), 30*time.Millisecond).Wrote(clk.Now())
	// The second job's slot is t0+T: it must wait for first send + T.
	second := wait(g, "a", p, t0.Add(T))
	waitWaiters(t, clk, 1)
	clk.Set(t0.Add(T))
	expectStillWaitingAfter20ms(t, second)
	clk.Set(t0.Add(30*time.Millisecond + T - time.Microsecond))
	expectStillWaitingAfter20ms(t, second) // not a microsecond early
	clk.Set(t0.Add(30*time.Millisecond + T))
	expectAt(t, second, 30*time.Millisecond+T).Done()
	// Another tenant is not held back at all.
	expectAt(t, wait(g, "b", p, t0), 30*time.Millisecond+T).Done()
}

func TestGateLetsABurstThrough(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 3}
	for i := 0; i < 3; i++ {
		expectAt(t, wait(g, "a", p, t0), 0).Wrote(t0)
	}
	fourth := wait(g, "a", p, t0)
	waitWaiters(t, clk, 1)
	expectStillWaitingAfter20ms(t, fourth)
	clk.Set(t0.Add(T - time.Microsecond))
	expectStillWaitingAfter20ms(t, fourth)
	clk.Set(t0.Add(T))
	expectAt(t, fourth, T).Done()
}

// A send is spaced from when the one before it was really written, and does
// not go at all until that is known.
func TestGateSpacesFromTheRealWrite(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	T := 100 * time.Millisecond
	p := leaky.Policy{Interval: T, Burst: 1}
	first := expectAt(t, wait(g, "a", p, t0), 0)
	// The first request is not written yet at the second one's slot.
	clk.Set(t0.Add(T))
	next := wait(g, "a", p, t0.Add(T))
	expectStillWaitingAfter20ms(t, next)
	// It is written 150 ms late: the second waits for that + T.
	clk.Set(t0.Add(150 * time.Millisecond))
	first.Wrote(clk.Now())
	waitWaiters(t, clk, 1)
	expectStillWaitingAfter20ms(t, next)
	clk.Set(t0.Add(250 * time.Millisecond))
	expectAt(t, next, 250*time.Millisecond).Done()
}

// An attempt that wrote nothing frees the gate without moving it.
func TestGateDoneWithoutWrite(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	p := leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1}
	first := expectAt(t, wait(g, "a", p, t0), 0)
	clk.Set(t0.Add(100 * time.Millisecond))
	next := wait(g, "a", p, t0.Add(100*time.Millisecond))
	expectStillWaitingAfter20ms(t, next)
	first.Done()
	expectAt(t, next, 100*time.Millisecond).Done()
}

// Sends that the gate releases obey the window rule of DESIGN.md invariant 1
// without the 2 ms it leaves to the machine: at most W/T + burst in any
// window W, whatever the lateness, and no two sends closer than T.
func TestGateWindowRuleUnderJitter(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
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
		// The clock moves on in steps of 0.1 ms while the send waits on
		// it (none of these sends waits on anything else: each one before
		// it was written).
		for len(ch) == 0 {
			testutil.WaitFor(t, 5*time.Second, "the send to go or wait for its time", func() bool { return len(ch) > 0 || clk.Waiters() > 0 })
			if len(ch) == 0 {
				clk.Advance(100 * time.Microsecond)
			}
		}
		tk := <-ch
		// Written a pseudo-random 0-0.4 ms after release.
		w := tk.At.Add(time.Duration(i*31%5) * 100 * time.Microsecond)
		clk.Set(w)
		tk.Wrote(w)
		sends = append(sends, w)
	}
	for i := range sends {
		for j := i + 1; j < len(sends); j++ {
			w := sends[j].Sub(sends[i])
			if n := j - i + 1; float64(n) > float64(w)/float64(T)+1 {
				t.Fatalf("%d sends within %v", n, w)
			}
		}
	}
}

// waitWaiters waits until n timers wait on clk: the sends waiting on their
// time have got that far.
func waitWaiters(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("%d timers waiting", n), func() bool { return clk.Waiters() >= n })
}

// A send waiting for its slot gives up when its lane is held: it must not go
// when the hold ends, ahead of the job that was pushed back.
func TestGateHoldReleasesWaiters(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	p := leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1}
	errc := make(chan error, 1)
	go func() {
		_, err := g.WaitLanes(context.Background(), t0.Add(time.Second), Lane{Key: "tenant:a", Policy: p}, Lane{Key: "downstream:sms"})
		errc <- err
	}()
	waitWaiters(t, clk, 1)
	g.Hold("downstream:sms", t0.Add(5*time.Second))
	select {
	case err := <-errc:
		var h *HeldError
		if !errors.As(err, &h) || h.Key != "downstream:sms" || !h.Until.Equal(t0.Add(5*time.Second)) {
			t.Fatalf("err %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting send did not give up")
	}
	// Refused at once until the hold ends; a shorter hold changes nothing.
	g.Hold("downstream:sms", t0.Add(time.Second))
	clk.Advance(4 * time.Second)
	if _, err := g.WaitLanes(context.Background(), clk.Now(), Lane{Key: "tenant:b", Policy: p}, Lane{Key: "downstream:sms"}); err == nil {
		t.Fatal("a send passed a held lane")
	}
	clk.Advance(time.Second)
	tk, err := g.WaitLanes(context.Background(), clk.Now(), Lane{Key: "tenant:b", Policy: p}, Lane{Key: "downstream:sms"})
	if err != nil {
		t.Fatal(err)
	}
	tk.Done()
}

// A hold that ends before a send's own time only delays it to then; the
// job must not be sent back in line for nothing.
func TestGateHoldEndingBeforeTheSlotDelaysNothing(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	p := leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1}
	g.Hold("tenant:a", t0.Add(50*time.Millisecond))
	ch := make(chan *Ticket, 1)
	go func() {
		tk, err := g.WaitLanes(context.Background(), t0.Add(50*time.Millisecond), Lane{Key: "tenant:a", Policy: p})
		if err != nil {
			t.Error(err)
		}
		ch <- tk
	}()
	waitWaiters(t, clk, 1)
	clk.Advance(50 * time.Millisecond)
	expectAt(t, ch, 50*time.Millisecond).Done()
}

// A lane's windows count real writes: with "2 per second", a third send
// waits a second after the first was written, whatever its slot said. A
// window full for longer than the grace holds the lane instead (the job goes
// back in line); a shorter wait is waited out.
func TestGateWindowsCountWrites(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	w, _ := leaky.ParseWindow("2/s")
	p := leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1, Windows: []leaky.Window{w}}
	lane := Lane{Key: "tenant:a", Policy: p}
	for i := 0; i < 2; i++ {
		tk, err := g.WaitLanes(context.Background(), clk.Now(), lane)
		if err != nil {
			t.Fatal(err)
		}
		tk.Wrote(clk.Now())
		clk.Advance(20 * time.Millisecond)
	}
	_, err := g.WaitLanes(context.Background(), clk.Now(), lane)
	var h *HeldError
	if !errors.As(err, &h) || !h.Until.Equal(t0.Add(time.Second)) {
		t.Fatalf("a third send 40ms after the first, under 2 per second: %v, want held until 1s", err)
	}
	clk.Advance(time.Second - 40*time.Millisecond - windowGrace/2)
	third := make(chan *Ticket, 1)
	go func() {
		tk, _ := g.WaitLanes(context.Background(), clk.Now(), lane)
		third <- tk
	}()
	waitWaiters(t, clk, 1)
	clk.Advance(windowGrace / 2)
	expectAt(t, third, time.Second).Done()
}

// Sends waiting together pass in the order of their slots, however the
// scheduler wakes them: a tenant's jobs reach the downstream in order.
func TestGatePassesInSlotOrder(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	p := leaky.Policy{Interval: time.Millisecond, Burst: 1}
	order := make(chan int, 3)
	for _, at := range []int{30, 20, 10} { // arrive latest slot first
		go func() {
			tk, err := g.WaitLanes(context.Background(), t0.Add(time.Duration(at)*time.Millisecond), Lane{Key: "tenant:a", Policy: p})
			if err != nil {
				t.Error(err)
				return
			}
			tk.Wrote(clk.Now())
			order <- at
		}()
	}
	testutil.WaitFor(t, 5*time.Second, "3 sends waiting", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		k := g.keys["tenant:a"]
		return k != nil && len(k.waiters) == 3
	})
	waitWaiters(t, clk, 1) // the head waits on its timer; the others on it
	clk.Advance(100 * time.Millisecond)
	for i, want := range []int{10, 20, 30} {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("passed the send of slot %dms, want %dms first", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("stuck")
		}
		if i < 2 {
			// The next one waits one interval after that write, on its
			// timer: the clock moves once it does (moved before, the
			// timer would be set from the new time, and wait on).
			waitWaiters(t, clk, 1)
			clk.Advance(time.Millisecond)
		}
	}
}

// A tenant held back by its own rate does not hold up another tenant on a
// shared downstream ceiling: order is kept per tenant only.
func TestGateNoHeadOfLineBlockingAcrossTenants(t *testing.T) {
	t.Parallel()
	clk, g := fakeGate()
	slow := leaky.Policy{Interval: time.Second, Burst: 1}
	ceiling := Lane{Key: "downstream:sms", Policy: leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1}}
	a := Lane{Key: "tenant:a", Policy: slow}
	b := Lane{Key: "tenant:b", Policy: slow}
	tk, err := g.WaitLanes(context.Background(), t0, a, ceiling)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	tk.Wrote(clk.Now()) // written late: a's next send waits until 1.3 s
	clk.Advance(700 * time.Millisecond)
	aDone := make(chan *Ticket, 1)
	go func() { tk, _ := g.WaitLanes(context.Background(), t0.Add(time.Second), a, ceiling); aDone <- tk }()
	waitWaiters(t, clk, 1)
	bDone := make(chan *Ticket, 1)
	go func() {
		tk, _ := g.WaitLanes(context.Background(), t0.Add(time.Second+time.Millisecond), b, ceiling)
		bDone <- tk
	}()
	waitWaiters(t, clk, 2)
	clk.Advance(time.Millisecond)
	expectAt(t, bDone, time.Second+time.Millisecond).Wrote(clk.Now())
	clk.Advance(300 * time.Millisecond)
	if tk := <-aDone; tk == nil || tk.At.Before(t0.Add(1300*time.Millisecond-2*time.Millisecond)) {
		t.Fatalf("a went at %v, before its own spacing allowed", tk.At.Sub(t0))
	} else {
		tk.Done()
	}
}
