package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// timeout is an attempt's downstream timeout (Route.Timeout). It runs while
// the attempt connects, writes and reads the answer, and stands still while
// the send waits at the gate: a wait for the slot, the tenant's rate, a
// window or a ceiling is never part of it, however long. When it runs out it
// cancels the attempt. Safe for concurrent use: the gate is passed in
// net/http's goroutines.
type timeout struct {
	clock  clock.Clock
	cancel context.CancelFunc

	mu      sync.Mutex
	left    time.Duration
	since   time.Time     // when it last started running
	running chan struct{} // closed when it stops running; nil while it stands still
	ranOut  bool
	ended   bool
}

// startTimeout starts a timeout of d on clk that calls cancel when it runs
// out.
func startTimeout(clk clock.Clock, d time.Duration, cancel context.CancelFunc) *timeout {
	t := &timeout{clock: clk, cancel: cancel, left: d}
	t.run()
	return t
}

// run starts the countdown again (a no-op while it runs).
func (t *timeout) run() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running != nil || t.ended || t.ranOut {
		return
	}
	t.since = t.clock.Now()
	running := make(chan struct{})
	t.running = running
	fire := t.clock.After(t.left)
	go func() {
		select {
		case <-fire:
			t.runOut(running)
		case <-running:
		}
	}()
}

func (t *timeout) runOut(running chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running != running {
		return // it stood still or ended first
	}
	close(running)
	t.running, t.left, t.ranOut = nil, 0, true
	t.cancel()
}

// standStill stops the countdown, keeping what is left (a no-op while it
// stands still).
func (t *timeout) standStill() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopLocked()
}

func (t *timeout) stopLocked() {
	if t.running == nil {
		return
	}
	t.left = max(0, t.left-t.clock.Now().Sub(t.since))
	close(t.running)
	t.running = nil
}

// end stops the timeout for good and reports whether it ran out.
func (t *timeout) end() (ranOut bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopLocked()
	t.ended = true
	return t.ranOut
}
