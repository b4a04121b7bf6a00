package redis

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// A process whose own clock is off by seconds reads Redis's clock within
// a round trip: Store.Clock (the schedule's, the dispatcher's) is its own
// clock plus the offset measured at Open, whichever way it is off, and the
// offset is within the uncertainty it claims (half the round trip it came
// from: a busy CI run's Open measured its best of five at 5 ms, 2.4 ms off,
// which a fixed 2 ms had not allowed for).
func TestStoreClockIsRedisTime(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	for _, skew := range []time.Duration{2 * time.Second, -2 * time.Second, 0} {
		s, err := Open(ctx, Options{Client: rdb, Policy: func(string) leaky.Policy { return leaky.Policy{} }, Testing: &TestHooks{ClockSkew: skew}})
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		server, err := rdb.Time(ctx).Result()
		back := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		ours := s.Clock().Now()
		u := s.rclock.Uncertainty()
		// TIME was answered between sent and back; ours was read after.
		if early, late := server.Sub(ours), ours.Sub(server.Add(time.Since(sent))); early > u+time.Millisecond || late > u+time.Millisecond {
			t.Errorf("skew %v: the store's clock read %v, Redis said %v (round trip %v, the store's uncertainty %v)", skew, ours.Format("15:04:05.000000"), server.Format("15:04:05.000000"), back.Sub(sent), u)
		}
		// The machine's clock is Redis's: the true offset is -skew.
		if off := s.rclock.Offset(); (off + skew).Abs() > u {
			t.Errorf("skew %v: offset to Redis measured %v, want %v within the uncertainty it claims, %v", skew, off, -skew, u)
		}
	}
}

// The offset in use moves only when a round trip shows it wrong: a slower
// round trip that agrees within its bounds leaves it (a step would move a
// send by as much); one that cannot agree moves it.
func TestOffsetStepsOnlyWhenShownWrong(t *testing.T) {
	c := &redisClock{own: skewed(0)}
	at := time.Now()
	c.add(sample{at: at, offset: 10 * time.Millisecond, rtt: 200 * time.Microsecond})
	c.add(sample{at: at.Add(time.Second), offset: 10*time.Millisecond + 150*time.Microsecond, rtt: 400 * time.Microsecond})
	if got := c.Offset(); got != 10*time.Millisecond {
		t.Errorf("offset %v after a slower round trip within bounds, want 10ms kept", got)
	}
	// Past the window, the first sample is gone; a fast one 1 ms off moves it.
	c.add(sample{at: at.Add(offsetWindow + 2*time.Second), offset: 11 * time.Millisecond, rtt: 100 * time.Microsecond})
	if got := c.Offset(); got != 11*time.Millisecond {
		t.Errorf("offset %v after a round trip 1 ms off its bounds, want 11ms", got)
	}
}

// A script is told the time only when the process knows Redis's clock
// within scriptClockBound from a round trip of the last two refreshes;
// else it reads TIME itself. A stale estimate starts a measurement (a
// process that only admits runs no keepMeasuring), after which the time
// is told again.
func TestScriptsAreToldTheTimeOnlyWhenItIsKnown(t *testing.T) {
	rdb := redisClient(t, 0)
	c := &redisClock{own: skewed(0)}
	if _, ok := c.fresh(scriptClockBound); ok {
		t.Fatal("told the time before any round trip")
	}
	c.add(sample{at: time.Now(), offset: 3 * time.Millisecond, rtt: 4 * scriptClockBound})
	if _, ok := c.fresh(scriptClockBound); ok {
		t.Fatalf("told the time from a round trip of %v (within %v at best)", 4*scriptClockBound, 2*scriptClockBound)
	}
	c = &redisClock{own: skewed(0)}
	c.add(sample{at: time.Now(), offset: 3 * time.Millisecond, rtt: 100 * time.Microsecond})
	got, ok := c.fresh(scriptClockBound)
	if want := time.Now().Add(3 * time.Millisecond); !ok || got.Sub(want).Abs() > time.Millisecond {
		t.Fatalf("fresh estimate: told %v (%v), want about %v", got, ok, want)
	}
	// Three seconds old: not told, and a measurement starts.
	c = &redisClock{own: skewed(0), rdb: rdb}
	c.add(sample{at: time.Now().Add(-3 * offsetRefresh), offset: 0, rtt: 100 * time.Microsecond})
	if _, ok := c.fresh(scriptClockBound); ok {
		t.Fatal("told the time from a round trip three refreshes old")
	}
	c.close()
	if _, ok := c.fresh(scriptClockBound); !ok && c.Uncertainty() <= scriptClockBound {
		t.Fatalf("after the measurement it started (uncertainty %v): still not told", c.Uncertainty())
	}
	c.mu.Lock()
	n := len(c.samples)
	c.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d samples after a stale read, want the old one and a new measurement", n)
	}
}
