package dispatch

import (
	"sync"
	"time"
)

// Circuit breaker bounds: after BreakerFailures failed attempts in a row a
// downstream gets no sends for BreakerCooldown, then one probe; each failed
// probe doubles the wait, up to BreakerMaxCooldown.
const (
	BreakerFailures    = 3
	BreakerCooldown    = time.Second
	BreakerMaxCooldown = 30 * time.Second
)

// breaker is one downstream's circuit breaker. While it is open, jobs are
// not attempted: they wait (their tenant pauses) and use up none of their
// attempts, instead of every waiting job being cycled through failures by
// an outage. Half-open, one job at a time probes the downstream.
type breaker struct {
	mu       sync.Mutex
	failures int // in a row
	open     bool
	probeAt  time.Time // open: when the next probe may go
	probing  bool      // a probe is out
	cooldown time.Duration
}

// probeWait is how long jobs that find a probe out wait before asking
// again: the probe takes at most a timeout, usually far less.
const probeWait = time.Second

// allow says whether an attempt may start now; probe reports that it is the
// half-open probe. If not, until is when to ask again.
func (b *breaker) allow(now time.Time) (probe bool, until time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.open:
		return false, time.Time{}, true
	case now.Before(b.probeAt):
		return false, b.probeAt, false
	case b.probing:
		return false, now.Add(probeWait), false
	}
	b.probing = true
	return true, time.Time{}, true
}

// outcome of an attempt, as the breaker sees it.
type health int

const (
	unsent  health = iota // nothing was sent: says nothing of the downstream
	healthy               // an answer that was not a server failure (2xx, 4xx, 429)
	failing               // 5xx, timeout, connection error
)

// report records how an attempt went. It returns the time of the next probe
// if this report opened the breaker (or kept it open after a probe).
func (b *breaker) report(now time.Time, probe bool, h health) (opened bool, probeAt time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch h {
	case unsent:
		return false, time.Time{}
	case healthy:
		b.failures, b.open, b.cooldown = 0, false, 0
		return false, time.Time{}
	}
	b.failures++
	if !probe && (b.open || b.failures < BreakerFailures) {
		return false, time.Time{} // already open (an attempt from before), or not yet
	}
	b.cooldown = min(max(BreakerCooldown, 2*b.cooldown), BreakerMaxCooldown)
	b.open, b.probeAt = true, now.Add(b.cooldown)
	return true, b.probeAt
}

// isOpen reports whether sends are stopped (for metrics and status).
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
