package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	var b breaker
	now := t0
	for i := 1; i < BreakerFailures; i++ {
		if opened, _ := b.report(now, false, failing); opened {
			t.Fatalf("opened after %d failures, want %d", i, BreakerFailures)
		}
	}
	opened, probeAt := b.report(now, false, failing)
	if !opened || !probeAt.Equal(now.Add(BreakerCooldown)) {
		t.Fatalf("after %d failures: opened %v, probe at %v", BreakerFailures, opened, probeAt.Sub(t0))
	}
	if _, until, ok := b.allow(now.Add(BreakerCooldown / 2)); ok || !until.Equal(probeAt) {
		t.Fatalf("open: allowed %v, wait until %v", ok, until.Sub(t0))
	}
	// One probe at a time.
	probe, _, ok := b.allow(probeAt)
	if !ok || !probe {
		t.Fatal("no probe once the cooldown passed")
	}
	if _, _, ok := b.allow(probeAt); ok {
		t.Fatal("a second attempt while the probe is out")
	}
	// A failed probe doubles the wait.
	opened, next := b.report(probeAt, true, failing)
	if !opened || !next.Equal(probeAt.Add(2*BreakerCooldown)) {
		t.Fatalf("failed probe: next probe at %v, want %v later", next.Sub(probeAt), 2*BreakerCooldown)
	}
	// A probe that sent nothing lets the next one try.
	probe, _, _ = b.allow(next)
	b.report(next, probe, unsent)
	if probe, _, ok := b.allow(next); !ok || !probe {
		t.Fatal("no new probe after an unsent one")
	}
	b.report(next, true, healthy)
	if probe, _, ok := b.allow(next); !ok || probe || b.isOpen() {
		t.Fatal("still open after a good probe")
	}
	// Closed again, it counts from zero.
	if opened, _ := b.report(next, false, failing); opened {
		t.Fatal("opened on the first failure after closing")
	}
}

// A send waiting for its slot gives up when its lane is held: it must not go
// when the hold ends, ahead of the job that was pushed back.
func TestGateHoldReleasesWaiters(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
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
	clk := clock.NewFake(t0)
	g := NewGate(clk)
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
	clk := clock.NewFake(t0)
	g := NewGate(clk)
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
	clk := clock.NewFake(t0)
	g := NewGate(clk)
	p := leaky.Policy{Interval: time.Millisecond, Burst: 1}
	order := make(chan int, 3)
	for _, at := range []int{30, 20, 10} { // arrive latest slot first
		go func() {
			tk, err := g.WaitLanes(context.Background(), t0.Add(time.Duration(at)*time.Millisecond), Lane{Key: "tenant:a", Policy: p})
			if err != nil {
				t.Error(err)
				return
			}
			order <- at
			tk.Wrote(clk.Now())
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		n := 0
		if k := g.keys["tenant:a"]; k != nil {
			n = len(k.waiters)
		}
		g.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters", n)
		}
		time.Sleep(100 * time.Microsecond)
	}
	waitWaiters(t, clk, 1) // the head waits on its timer; the others on it
	clk.Advance(100 * time.Millisecond)
	for _, want := range []int{10, 20, 30} {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("passed the send of slot %dms, want %dms first", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("stuck")
		}
		clk.Advance(time.Millisecond)
	}
}

// A tenant held back by its own rate does not hold up another tenant on a
// shared downstream ceiling: order is kept per tenant only.
func TestGateNoHeadOfLineBlockingAcrossTenants(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	g := NewGate(clk)
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
