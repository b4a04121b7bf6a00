package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
)

// redisClock is this process's reading of Redis's clock: its own clock
// plus its offset to Redis TIME, measured from round trips (DESIGN.md 6c,
// "one clock on Redis"). Every time a worker writes to Redis or reads from
// it (a job's dispatch time, a send's write, a tenant's next send, a
// pause) is in Redis's clock, and another worker compares it with its own
// reading of the same clock: so spacing across a handover and the promises
// of admission do not depend on the workers' clocks agreeing with each
// other or with Redis. The dispatcher waits and stamps writes on it too
// (Store.Clock): waiting for a Redis-clock dispatch time on the machine's
// clock would send early or late by the machine's offset.
//
// Redis answered TIME somewhere between the request and the answer, so a
// round trip of RTT gives the offset within RTT/2 when the process's clock
// is read at its midpoint. The estimate kept is the one from the fastest
// round trip of the last offsetWindow (a busy machine's slow round trips
// give wide bounds), and the offset in use changes only when a new
// estimate's bounds do not overlap its own: a needless step of a few
// hundred microseconds would move a send by as much, and the in-process
// gate's spacing is read on this clock.
type redisClock struct {
	own clock.Clock // the process's own clock
	// server, if set, reads the clock that stands for Redis's TIME
	// (TestHooks.OwnClock), exactly: no microsecond grain.
	server func(context.Context) (time.Time, error)

	offset atomic.Int64 // ns to add to own.Now(), in use

	mu      sync.Mutex
	inUse   sample   // the sample offset came from
	samples []sample // the last offsetWindow's, oldest first

	// rdb, if set, is measured on demand when a reading is asked of a
	// stale estimate (fresh): a process that only admits runs no
	// keepMeasuring.
	rdb       goredis.UniversalClient
	measuring chan struct{} // closed when the measurement fresh started ends; nil: none (mu)
	closed    bool          // the store is closed: fresh starts none (mu)
}

// sample is one round trip's estimate of the offset.
type sample struct {
	at     time.Time // on own, at the midpoint
	offset time.Duration
	rtt    time.Duration
}

// offsetWindow is how far back the fastest round trip is looked for;
// offsetRefresh how often a worker measures (one TIME a second).
const (
	offsetWindow  = 30 * time.Second
	offsetRefresh = time.Second
)

func (c *redisClock) Now() time.Time                         { return c.own.Now().Add(time.Duration(c.offset.Load())) }
func (c *redisClock) After(d time.Duration) <-chan time.Time { return c.own.After(d) }

// Precise is whether the process's clock sleeps precisely (clock.SleepPrecise).
func (c *redisClock) Precise() bool { return clock.Precise(c.own) }

// Offset is the offset in use: Redis's clock minus this process's.
func (c *redisClock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Uncertainty bounds how far the offset in use may be from the true one:
// half the round trip it came from (plus Redis's microsecond). A time this
// process stamps may be that much early in Redis's clock, and a time it
// waits for may come that much early: what it hands to another worker as
// a floor, and a floor it takes from one, carry it (Store.clockMargin).
func (c *redisClock) Uncertainty() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inUse.rtt/2 + c.grain()
}

// fresh is the clock's reading if the offset in use is known within
// bound (Uncertainty) and was measured within the last two refreshes: a
// script may then be told the time instead of asking Redis's TIME. A
// stale estimate starts a measurement (one at a time) and is not used
// until it comes back.
func (c *redisClock) fresh(bound time.Duration) (time.Time, bool) {
	now := c.own.Now()
	c.mu.Lock()
	ok := !c.inUse.at.IsZero() && c.inUse.rtt/2+c.grain() <= bound
	stale := len(c.samples) == 0 || now.Sub(c.samples[len(c.samples)-1].at) > 2*offsetRefresh
	if stale && c.rdb != nil && c.measuring == nil && !c.closed {
		done := make(chan struct{})
		c.measuring = done
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.measure(ctx, c.rdb)
			cancel()
			c.mu.Lock()
			c.measuring = nil
			c.mu.Unlock()
			close(done)
		}()
	}
	c.mu.Unlock()
	if !ok || stale {
		return time.Time{}, false
	}
	return now.Add(time.Duration(c.offset.Load())), true
}

// close waits for a measurement fresh started, and starts no more.
func (c *redisClock) close() {
	c.mu.Lock()
	c.closed = true
	done := c.measuring
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}

// grain is how coarse a reading of the server's clock is: TIME's
// microsecond, and one more for reading it between two of ours.
func (c *redisClock) grain() time.Duration {
	if c.server != nil {
		return 0
	}
	return 2 * time.Microsecond
}

// measure asks Redis its TIME once and takes the round trip into the
// estimate.
func (c *redisClock) measure(ctx context.Context, rdb goredis.UniversalClient) error {
	read := func(ctx context.Context) (time.Time, error) { return rdb.Time(ctx).Result() }
	if c.server != nil {
		read = c.server
	}
	sent := c.own.Now()
	server, err := read(ctx)
	back := c.own.Now()
	if err != nil {
		return err
	}
	rtt := back.Sub(sent)
	mid := sent.Add(rtt / 2)
	c.add(sample{at: mid, offset: server.Sub(mid), rtt: rtt})
	return nil
}

// add keeps s among the window's samples and moves the offset in use when
// the best of them says it is wrong.
func (c *redisClock) add(s sample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.samples[:0]
	for _, old := range c.samples {
		if s.at.Sub(old.at) <= offsetWindow {
			kept = append(kept, old)
		}
	}
	c.samples = append(kept, s)
	best := c.samples[0]
	for _, x := range c.samples[1:] {
		if x.rtt < best.rtt {
			best = x
		}
	}
	// Bounds: the offset is within rtt/2 of each estimate (plus Redis's
	// microsecond and the reads' granularity).
	gap := (best.offset - c.inUse.offset).Abs()
	if c.inUse.at.IsZero() || gap > (best.rtt+c.inUse.rtt)/2+c.grain() {
		c.inUse = best
		c.offset.Store(int64(best.offset))
	}
}

// calibrate measures a few round trips in a row (at Open: the first
// tenure starts on a good estimate, not on one slow first connection's).
func (c *redisClock) calibrate(ctx context.Context, rdb goredis.UniversalClient) error {
	for range 5 {
		if err := c.measure(ctx, rdb); err != nil {
			return err
		}
	}
	return nil
}

// keepMeasuring measures every offsetRefresh until ctx ends (a worker's
// Consume): the machine's clock drifts, and may be stepped.
func (c *redisClock) keepMeasuring(ctx context.Context, rdb goredis.UniversalClient) {
	t := time.NewTicker(offsetRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A failure leaves the estimate as it is: Redis away stops the
			// worker's writes anyway, and the offset has not moved.
			mctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = c.measure(mctx, rdb)
			cancel()
		}
	}
}

// skewed is a clock off the machine's by a fixed amount: a machine whose
// clock is wrong, for tests (TestHooks.ClockSkew).
type skewed time.Duration

func (s skewed) Now() time.Time                         { return time.Now().Add(time.Duration(s)) }
func (s skewed) After(d time.Duration) <-chan time.Time { return time.After(d) }
