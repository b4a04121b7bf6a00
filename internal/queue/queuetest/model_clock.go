package queuetest

import (
	"sync"
	"time"
)

// stepClock is the model test's fake clock: like clock.Fake it moves only
// when told, and it also says when its earliest waiter is due, so that the
// test can step from one moment the store waits for to the next (every
// hand-over, wake-up and write then happens at its exact time, never "some
// time within a step"), and how many waits the store has begun (a store
// that keeps starting new waits is still busy).
type stepClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []stepWaiter
	afters  uint64 // After calls so far
}

type stepWaiter struct {
	at time.Time
	ch chan time.Time
}

func newStepClock(t time.Time) *stepClock { return &stepClock{now: t} }

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.afters++
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, stepWaiter{at: c.now.Add(d), ch: ch})
	return ch
}

// Set moves the clock to t (never backwards) and fires the waiters due.
func (c *stepClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
			continue
		}
		kept = append(kept, w)
	}
	c.waiters = kept
}

// next is the earliest waiter's time (false if none). Waiters nobody
// listens to any more (a wait cut short by a poke) count too: stopping
// there costs a moment and misses nothing.
func (c *stepClock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for _, w := range c.waiters {
		if at.IsZero() || w.at.Before(at) {
			at = w.at
		}
	}
	return at, !at.IsZero()
}

// afterCalls counts the waits begun so far.
func (c *stepClock) afterCalls() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.afters
}
