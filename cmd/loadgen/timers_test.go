package main

import (
	"strings"
	"testing"
	"time"
)

// Every goroutine wakes once per interval over the duration, and the
// report counts each wake-up.
func TestTimersCountsEveryWakeUp(t *testing.T) {
	var out strings.Builder
	n := timerLateness(&out, 10, 50*time.Millisecond, 200*time.Millisecond)
	if n != 40 {
		t.Fatalf("measured %d wake-ups, want 40 (10 goroutines, 4 intervals each): %s", n, out.String())
	}
	if !strings.HasPrefix(out.String(), "40 wake-ups (10 goroutines every 50ms for 200ms): late p50 ") {
		t.Fatalf("report: %q", out.String())
	}
}
