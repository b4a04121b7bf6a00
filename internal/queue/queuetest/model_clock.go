package queuetest

import (
	"sync/atomic"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// stepClock is the model test's fake clock: a clock.Fake, which moves only
// when told and says when its earliest waiter is due (so that the test can
// step from one moment the store waits for to the next: every hand-over,
// wake-up and write then happens at its exact time, never "some time
// within a step"), that also counts the waits the store has begun (a store
// that keeps starting new waits is still busy).
type stepClock struct {
	*clock.Fake
	afters atomic.Uint64 // After calls so far
}

func newStepClock(t time.Time) *stepClock { return &stepClock{Fake: clock.NewFake(t)} }

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	c.afters.Add(1)
	return c.Fake.After(d)
}

func (c *stepClock) AfterAt(t time.Time) <-chan time.Time {
	c.afters.Add(1)
	return c.Fake.AfterAt(t)
}

// afterCalls counts the waits begun so far.
func (c *stepClock) afterCalls() uint64 { return c.afters.Load() }
