// Package clock is the one source of time for everything that paces: real
// time in the service, a fake that tests advance by hand so timing rules are
// checked without sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and waits for it.
type Clock interface {
	Now() time.Time
	// After is time.After on this clock.
	After(d time.Duration) <-chan time.Time
}

// AfterAt fires once c reads t. A wait computed from an earlier reading
// (After(t.Sub(now))) fires late by however long the caller took since it
// read the clock: a busy machine's pass over the store, or a fake clock
// moved meanwhile. A clock that can wait for an instant (Fake) does so.
func AfterAt(c Clock, t time.Time) <-chan time.Time {
	if a, ok := c.(interface {
		AfterAt(time.Time) <-chan time.Time
	}); ok {
		return a.AfterAt(t)
	}
	return c.After(t.Sub(c.Now()))
}

// Real is the wall clock (with Go's monotonic reading for durations).
type Real struct{}

func (Real) Now() time.Time                         { return time.Now() }
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Fake is a clock that moves only when Advance or Set is called. Safe for
// concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewFake returns a fake clock that reads t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.afterAt(f.now.Add(d))
}

// AfterAt fires once the clock reads t (at once if it does already).
func (f *Fake) AfterAt(t time.Time) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.afterAt(t)
}

func (f *Fake) afterAt(t time.Time) <-chan time.Time {
	ch := make(chan time.Time, 1)
	if !t.After(f.now) {
		ch <- f.now
		return ch
	}
	f.waiters = append(f.waiters, fakeWaiter{at: t, ch: ch})
	return ch
}

// Advance moves the clock forward by d and fires the waiters that are due.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the clock to t (never backwards) and fires the waiters that are due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.now = t
	}
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if !w.at.After(f.now) {
			w.ch <- f.now
			continue
		}
		kept = append(kept, w)
	}
	f.waiters = kept
}

// Waiters is how many After channels have not fired yet; tests wait for it
// to know a goroutine has started waiting.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// Next is when the earliest After that has not fired yet is due (false if
// none), so that a test can step the clock from one wait to the next. An
// After nobody reads any more counts too: the clock cannot tell.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var at time.Time
	for _, w := range f.waiters {
		at = Earliest(at, w.at)
	}
	return at, !at.IsZero()
}

// Never is the time of something that waits until told otherwise (an
// operator hold with no end): far enough that nothing reaches it, near
// enough that adding an interval to it cannot overflow.
var Never = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// Later is the later of a and b.
func Later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Earliest is the earlier of a and b, where the zero time means "none"
// (so it loses to any real time).
func Earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
