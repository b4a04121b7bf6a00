package leaky

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func burst(t *testing.T, p Policy, n int) (admitted int, s State) {
	t.Helper()
	for i := 0; i < n; i++ {
		var d Decision
		d, s = Admit(s, t0, p)
		if d.Admitted {
			admitted++
		}
	}
	return admitted, s
}

func TestBurstAgainstCapacity(t *testing.T) {
	t.Parallel()
	T := 50 * time.Millisecond
	cases := []struct {
		name   string
		policy Policy
		n      int
		want   int
	}{
		{"leaky capacity 10 admits 11 of 30", Policy{Interval: T, Burst: 1, Capacity: 10}, 30, 11},
		{"leaky capacity 0 admits 1", Policy{Interval: T, Burst: 1, Capacity: 0}, 5, 1},
		{"token burst 10 admits 10 of 30", Policy{Interval: T, Burst: 10, Capacity: 0}, 30, 10},
		{"burst 5 and capacity 10 admit 15", Policy{Interval: T, Burst: 5, Capacity: 10}, 30, 15},
		{"fewer than room: all", Policy{Interval: T, Burst: 1, Capacity: 10}, 7, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, s := burst(t, c.policy, c.n)
			if got != c.want {
				t.Fatalf("admitted %d of %d, want %d", got, c.n, c.want)
			}
			if w := Waiting(s, t0, c.policy); w != c.want-min(c.want, c.policy.Burst) {
				t.Fatalf("Waiting = %d, want %d", w, c.want-min(c.want, c.policy.Burst))
			}
		})
	}
}

func TestBurstSlotsAndDelays(t *testing.T) {
	t.Parallel()
	T := 100 * time.Millisecond
	p := Policy{Interval: T, Burst: 3, Capacity: 2}
	// 3 go at once, 2 wait one and two intervals, the 6th is refused.
	want := []time.Duration{0, 0, 0, T, 2 * T}
	var s State
	for i, w := range want {
		var d Decision
		d, s = Admit(s, t0, p)
		if !d.Admitted || d.Delay != w || !d.Slot.Equal(t0.Add(w)) {
			t.Fatalf("job %d: %+v, want admitted with delay %v", i, d, w)
		}
	}
	d, s2 := Admit(s, t0, p)
	if d.Admitted || d.RetryAfter != T {
		t.Fatalf("6th: %+v, want rejected with RetryAfter %v", d, T)
	}
	if s2 != s {
		t.Fatalf("a rejection changed the state: %v -> %v", s, s2)
	}
}

func TestSteadyStreamSlightlyTooFast(t *testing.T) {
	t.Parallel()
	T := 100 * time.Millisecond
	gap := 90 * time.Millisecond // arrivals 10 ms faster than the rate
	p := Policy{Interval: T, Burst: 1, Capacity: 100}
	var s State
	for i := 0; i < 100; i++ {
		now := t0.Add(time.Duration(i) * gap)
		var d Decision
		d, s = Admit(s, now, p)
		if !d.Admitted {
			t.Fatalf("job %d rejected: %+v", i, d)
		}
		if want := time.Duration(i) * (T - gap); d.Delay != want {
			t.Fatalf("job %d waits %v, want %v (growing by %v a job)", i, d.Delay, want, T-gap)
		}
	}
}

// shapes are a policy of each shape at interval T: a leaky queue, a token
// bucket, and a bucket with a queue behind it.
func shapes(T time.Duration) []Policy {
	return []Policy{
		{Interval: T, Burst: 1, Capacity: 4},
		{Interval: T, Burst: 6, Capacity: 0},
		{Interval: T, Burst: 3, Capacity: 3},
	}
}

func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	for _, p := range shapes(70 * time.Millisecond) {
		_, s := burst(t, p, 50)
		d, _ := Admit(s, t0, p)
		if d.Admitted || d.RetryAfter <= 0 {
			t.Fatalf("%+v: want a rejection with RetryAfter > 0, got %+v", p, d)
		}
		at := t0.Add(d.RetryAfter)
		if again, _ := Admit(s, at, p); !again.Admitted {
			t.Fatalf("%+v: job at RetryAfter %v rejected: %+v", p, d.RetryAfter, again)
		}
		if early, _ := Admit(s, at.Add(-time.Nanosecond), p); early.Admitted {
			t.Fatalf("%+v: job 1ns before RetryAfter admitted", p)
		}
	}
}

func TestDrainAndExpectedDelay(t *testing.T) {
	t.Parallel()
	T := time.Second
	p := Policy{Interval: T, Burst: 1, Capacity: 10}
	_, s := burst(t, p, 11)
	steps := []struct {
		at      time.Duration
		waiting int
		delay   time.Duration
	}{
		{0, 10, 11 * T},
		{500 * time.Millisecond, 10, 10*T + 500*time.Millisecond},
		{T, 9, 10 * T},
		{10 * T, 0, T},
		{11 * T, 0, 0},
		{100 * T, 0, 0},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		if w := Waiting(s, now, p); w != st.waiting {
			t.Errorf("at %v: Waiting = %d, want %d", st.at, w, st.waiting)
		}
		if d := ExpectedDelay(s, now, p); d != st.delay {
			t.Errorf("at %v: ExpectedDelay = %v, want %v", st.at, d, st.delay)
		}
	}
	if Idle(s, t0.Add(10*T)) || !Idle(s, t0.Add(11*T)) {
		t.Errorf("Idle wrong around TAT %v", s.TAT)
	}
}

func TestReserveIgnoresCapacityButKeepsSpacing(t *testing.T) {
	t.Parallel()
	T := 10 * time.Millisecond
	p := Policy{Interval: T, Burst: 1, Capacity: 1}
	_, s := burst(t, p, 2) // full: slots t0, t0+T
	slot, s := Reserve(s, t0, p)
	if !slot.Equal(t0.Add(2 * T)) {
		t.Fatalf("reserve slot %v, want t0+2T", slot.Sub(t0))
	}
	// A retry that must not go before t0+1s gets exactly that.
	slot, s = Reserve(s, t0.Add(time.Second), p)
	if !slot.Equal(t0.Add(time.Second)) || !s.TAT.Equal(t0.Add(time.Second+T)) {
		t.Fatalf("reserve at 1s: slot %v tat %v", slot.Sub(t0), s.TAT.Sub(t0))
	}
}

func TestClockGoingBackwards(t *testing.T) {
	t.Parallel()
	T := time.Second
	p := Policy{Interval: T, Burst: 1, Capacity: 20}
	d1, s := Admit(State{}, t0.Add(10*T), p)
	d2, _ := Admit(s, t0, p) // a caller whose clock reads earlier
	if !d1.Admitted || !d2.Admitted {
		t.Fatal("want both admitted")
	}
	if !d2.Slot.After(d1.Slot) || d2.Slot.Sub(d1.Slot) < T {
		t.Fatalf("second slot %v not spaced after first %v", d2.Slot, d1.Slot)
	}
}

// The window rule of DESIGN.md invariant 1, on slots alone: in any window of
// length W at most W/T + burst slots.
func TestSlotsObeyWindowRule(t *testing.T) {
	t.Parallel()
	T := 30 * time.Millisecond
	for _, p := range []Policy{{Interval: T, Burst: 1, Capacity: 20}, {Interval: T, Burst: 7, Capacity: 0}, {Interval: T, Burst: 4, Capacity: 9}} {
		var s State
		var slots []time.Time
		now := t0
		for i := 0; i < 2000; i++ {
			now = now.Add(time.Duration(i*7919%41) * time.Millisecond / 3)
			var d Decision
			d, s = Admit(s, now, p)
			if d.Admitted {
				slots = append(slots, d.Slot)
			}
		}
		for i := range slots {
			for j := i; j < len(slots) && slots[j].Sub(slots[i]) <= 20*T; j++ {
				w := slots[j].Sub(slots[i])
				if n := j - i + 1; n > int(w/T)+p.Burst {
					t.Fatalf("%+v: %d slots within %v", p, n, w)
				}
			}
		}
	}
}
