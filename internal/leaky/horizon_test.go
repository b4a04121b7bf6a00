package leaky

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

func TestMaxHorizonIsTenYears(t *testing.T) {
	t.Parallel()
	if MaxHorizon != 87600*time.Hour {
		t.Fatalf("MaxHorizon %v, want 87600h", MaxHorizon)
	}
}

func TestHorizon(t *testing.T) {
	t.Parallel()
	hour, day := time.Hour, Day
	hourly := mustWindow("10/h")
	cases := []struct {
		name string
		p    Policy
		want time.Duration
	}{
		{"leaky: capacity intervals", Policy{Interval: time.Second, Burst: 1, Capacity: 10}, 10 * time.Second},
		{"token: burst less one", Policy{Interval: time.Second, Burst: 10}, 9 * time.Second},
		{"both", Policy{Interval: time.Second, Burst: 5, Capacity: 10}, 14 * time.Second},
		{"capacity 0, burst 1: nothing ahead", Policy{Interval: hour, Burst: 1}, 0},
		{"1/d capacity 3650: exactly ten years", Policy{Interval: day, Burst: 1, Capacity: 3650}, MaxHorizon},
		{"a window holds the queue back a length per N", Policy{Interval: time.Second, Burst: 1, Capacity: 25, Windows: []Window{hourly}}, 25*time.Second + 3*hour},
		{"every window counts", Policy{Interval: time.Second, Burst: 1, Capacity: 9, Windows: []Window{hourly, mustWindow("100/d")}}, 9*time.Second + hour + day},
		{"overflow saturates", Policy{Interval: 366 * day, Burst: 1_000_000, Capacity: 10_000_000}, math.MaxInt64},
		{"overflow in a window saturates", Policy{Interval: time.Microsecond, Burst: 1, Capacity: 10_000_000, Windows: []Window{mustWindow("1/366d")}}, math.MaxInt64},
	}
	for _, c := range cases {
		if got := c.p.Horizon(); got != c.want {
			t.Errorf("%s: Horizon %v, want %v", c.name, got, c.want)
		}
	}
}

func TestHorizonYearsSaysHowFarPastADuration(t *testing.T) {
	t.Parallel()
	p := Policy{Interval: Day, Burst: 1, Capacity: 200_000}
	if y := p.HorizonYears(); math.Floor(y) != 547 {
		t.Errorf("1/d capacity 200000: %.2f years, want 547.x", y)
	}
	huge := Policy{Interval: 366 * Day, Burst: 1, Capacity: 10_000_000}
	if y := huge.HorizonYears(); y < 1e7 {
		t.Errorf("saturated horizon reads %.0f years, want over 10 million", y)
	}
	if y := (Policy{Interval: Day, Burst: 1, Capacity: 3650}).HorizonYears(); y != 10 {
		t.Errorf("1/d capacity 3650: %v years, want 10", y)
	}
}

func TestValidateRefusesAHorizonPastMax(t *testing.T) {
	t.Parallel()
	ok := Policy{Interval: Day, Burst: 1, Capacity: 3650}
	if err := ok.Validate(); err != nil {
		t.Fatalf("ten years: %v", err)
	}
	for _, p := range []Policy{
		{Interval: Day, Burst: 1, Capacity: 3651},
		{Interval: Day, Burst: 1, Capacity: 200_000},
		{Interval: 366 * Day, Burst: 1_000_000},
	} {
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "MaxHorizon") {
			t.Errorf("%+v: %v, want a refusal naming MaxHorizon", p, err)
		}
	}
}

// A full bucket never schedules past its horizon: fill it with nothing
// sent, and every slot (and the state, one interval on) stays within.
func TestHorizonBoundsTheSchedule(t *testing.T) {
	t.Parallel()
	T := time.Second
	for _, p := range []Policy{
		{Interval: T, Burst: 1, Capacity: 10},
		{Interval: T, Burst: 10},
		{Interval: T, Burst: 4, Capacity: 7},
		{Interval: T, Burst: 1, Capacity: 25, Windows: []Window{mustWindow("10/m")}},
		{Interval: T, Burst: 3, Capacity: 30, Windows: []Window{mustWindow("4/10s"), mustWindow("10/m")}},
	} {
		var s State
		var recent []Recent
		var last time.Time
		for waiting := 0; ; waiting++ {
			d, st, r := Decide(s, recent, t0, p, 1, waiting)
			if !d.Admitted {
				break
			}
			s, recent, last = st, r, clock.Later(last, d.Slot)
		}
		if ahead := last.Sub(t0); ahead > p.Horizon() {
			t.Errorf("%+v: a slot %v ahead, past the horizon %v", p, ahead, p.Horizon())
		}
		if ahead := s.TAT.Sub(t0); ahead > p.Horizon()+p.Interval {
			t.Errorf("%+v: TAT %v ahead, past the horizon %v and one interval", p, ahead, p.Horizon())
		}
	}
}

// mustWindow is ParseWindow for constants.
func mustWindow(s string) Window {
	w, err := ParseWindow(s)
	if err != nil {
		panic(err)
	}
	return w
}
