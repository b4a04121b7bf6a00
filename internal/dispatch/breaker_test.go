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
