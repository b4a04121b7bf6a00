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

// The model's pause (mpause): tenant time under pushbacks and holds.

func (p mpause) tenantTime(now time.Time) time.Time {
	t := now
	if !p.held.IsZero() && p.held.Before(t) {
		t = p.held
	}
	return laterOf(t, p.until).Add(-p.shift)
}

// real is when tenant time reaches slot (false while held: never).
func (p mpause) real(slot time.Time) (time.Time, bool) {
	if !p.held.IsZero() {
		return time.Time{}, false
	}
	return laterOf(p.until, slot.Add(p.shift)), true
}

func (p mpause) paused(now time.Time) bool { return !p.held.IsZero() || now.Before(p.until) }

// pushback stops tenant time from min(now, from) until until.
func (p mpause) pushback(now, until, from time.Time) mpause {
	if !until.After(now) {
		return p
	}
	frozen := p.tenantTime(now)
	if !from.IsZero() && from.Before(frozen) {
		frozen = from
	}
	p.until = laterOf(p.until, until)
	p.shift = p.until.Sub(frozen)
	return p
}

func (p mpause) hold(now time.Time) mpause {
	if p.held.IsZero() {
		p.held = now
	}
	return p
}

func (p mpause) resume(now time.Time) mpause {
	if p.held.IsZero() {
		return p
	}
	frozen := p.tenantTime(now)
	p.held = time.Time{}
	p.until = laterOf(p.until, now)
	p.shift = p.until.Sub(frozen)
	return p
}

// told is what people are told of slot at now: its real time, or for a held
// tenant the time it would have if resumed now.
func (p mpause) told(slot, now time.Time) time.Time {
	at, _ := p.resume(now).real(slot)
	return at
}
