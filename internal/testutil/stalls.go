package testutil

import (
	"sync"
	"testing"
	"time"
)

// Stalls measures the machine's part in a late send: a sleeper that has
// nothing else to do wakes every stallTick, and each wake more than
// StallFloor late is kept as a stall. With every core busy (and a
// hypervisor taking cores back) such a sleeper misses its time by tens of
// milliseconds (docs/RELIABILITY.md), so no process on the machine keeps
// a 50 ms promise through that, and the gate passes a late send's
// lateness down the queue behind it (DESIGN.md invariant 1). A test of
// promises on real time may excuse a broken one by no more than the
// stalls seen while it waited, and says how many it excused: it still
// fails on a promise broken while the machine ran. It measures the
// machine apart from the sends, so a send late for reasons of its own
// is not excused, as it would be when stalls are read off the gaps
// between arrivals.
type Stalls struct {
	mu     sync.Mutex
	stalls []span
	stop   chan struct{}
	done   chan struct{}
}

// span is a stall: a wake due at from came at to.
type span struct{ from, to time.Time }

// StallFloor is the lateness a wake may have and not count as a stall:
// a Go timer on an idle runtime wakes up to a millisecond late, and on a
// quiet machine with a busy process a few.
const StallFloor = 5 * time.Millisecond

const stallTick = 2 * time.Millisecond

// StartStalls starts measuring until the test ends.
func StartStalls(t testing.TB) *Stalls {
	s := &Stalls{stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	t.Cleanup(func() { close(s.stop); <-s.done })
	return s
}

func (s *Stalls) run() {
	defer close(s.done)
	due := time.Now().Add(stallTick)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(time.Until(due)):
		}
		if now := time.Now(); now.Sub(due) > StallFloor {
			s.add(due, now)
		}
		due = time.Now().Add(stallTick)
	}
}

func (s *Stalls) add(from, to time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalls = append(s.stalls, span{from, to})
}

// Within is how long the machine stalled between from and to: the sum of
// the stalls that overlap it, each whole (a stall that ends inside delayed
// what came after it).
func (s *Stalls) Within(from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum time.Duration
	for _, x := range s.stalls {
		if x.to.After(from) && x.from.Before(to) {
			sum += x.to.Sub(x.from)
		}
	}
	return sum
}

// Worst is the longest stall seen.
func (s *Stalls) Worst() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var worst time.Duration
	for _, x := range s.stalls {
		worst = max(worst, x.to.Sub(x.from))
	}
	return worst
}
