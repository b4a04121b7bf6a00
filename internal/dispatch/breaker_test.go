package dispatch

import "testing"

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
