package leaky

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A cost-3 job takes three slots: at 10/s the next job goes 300 ms later,
// and what the queue says (delay, Retry-After) counts it.
func TestCostTakesSlots(t *testing.T) {
	t.Parallel()
	T := 100 * time.Millisecond
	p := Policy{Interval: T, Burst: 1, Capacity: 5}
	d, s := AdmitCost(State{}, t0, p, 3)
	if !d.Admitted || d.Delay != 0 {
		t.Fatalf("cost 3 on a quiet bucket: %+v", d)
	}
	d, s = AdmitCost(s, t0, p, 1)
	if !d.Admitted || d.Delay != 3*T {
		t.Fatalf("the job after a cost-3 job waits %v, want %v", d.Delay, 3*T)
	}
	if got := ExpectedDelay(s, t0, p); got != 4*T {
		t.Fatalf("expected delay %v, want %v", got, 4*T)
	}
	// Capacity 5 is in slots: 4 are taken, a cost-2 job would end at slot 5.
	if d, _ := AdmitCost(s, t0, p, 2); !d.Admitted {
		t.Fatalf("cost 2 fits in the last two places: %+v", d)
	}
	d, _ = AdmitCost(s, t0, p, 3)
	if d.Admitted || d.RetryAfter != T {
		t.Fatalf("cost 3 past capacity: %+v, want refused for %v", d, T)
	}
	// Retry-After is exact: admitted then, not a moment before.
	if d2, _ := AdmitCost(s, t0.Add(T-time.Nanosecond), p, 3); d2.Admitted {
		t.Fatal("admitted before its Retry-After")
	}
	if d2, _ := AdmitCost(s, t0.Add(T), p, 3); !d2.Admitted {
		t.Fatal("refused at its Retry-After")
	}
}

func TestMaxCost(t *testing.T) {
	t.Parallel()
	T := 100 * time.Millisecond
	for _, p := range shapes(T) {
		max := p.MaxCost()
		if d, _ := AdmitCost(State{}, t0, p, max); !d.Admitted {
			t.Fatalf("%+v: MaxCost %d refused on a quiet bucket", p, max)
		}
		// Above it, never: not now, not after any wait.
		for _, wait := range []time.Duration{0, time.Hour} {
			if d, _ := AdmitCost(State{}, t0.Add(wait), p, max+1); d.Admitted {
				t.Fatalf("%+v: cost %d admitted", p, max+1)
			}
		}
	}
	p := Policy{Interval: T, Burst: 1, Capacity: 100, Windows: []Window{{N: 20, Length: time.Minute}}}
	if p.MaxCost() != 20 {
		t.Fatalf("a window of 20 caps cost at 20, got %d", p.MaxCost())
	}
}

// With cost 1 everywhere, AdmitCost is Admit on random arrivals.
func TestCostOneIsAdmit(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	p := Policy{Interval: 50 * time.Millisecond, Burst: 3, Capacity: 4}
	var a, b State
	now := t0
	for i := 0; i < 10000; i++ {
		now = now.Add(time.Duration(r.Int64N(int64(80 * time.Millisecond))))
		da, sa := Admit(a, now, p)
		db, sb := AdmitCost(b, now, p, 1)
		if da != db || sa != sb {
			t.Fatalf("step %d: Admit %+v %v, AdmitCost %+v %v", i, da, sa, db, sb)
		}
		a, b = sa, sb
	}
}

// rate 5/s with a window of 20 per minute: the first 20 go at 5/s, the 21st
// a minute after the first, and so on; no window of a minute ever holds
// more than 20.
func TestWindowBesideTheRate(t *testing.T) {
	t.Parallel()
	w, err := ParseWindow("20/m")
	if err != nil {
		t.Fatal(err)
	}
	T := 200 * time.Millisecond
	p := Policy{Interval: T, Burst: 1, Capacity: 100, Windows: []Window{w}}
	var s State
	var recent []Recent
	var slots []time.Time
	for i := 0; i < 60; i++ {
		var d Decision
		d, s, recent = Decide(s, recent, t0, p, 1, i)
		if !d.Admitted || d.Delay != d.Slot.Sub(t0) {
			t.Fatalf("job %d: %+v", i, d)
		}
		slots = append(slots, d.Slot)
	}
	// Capacity is counted: 100 wait, the 101st is refused.
	for i := 60; i < 101; i++ {
		var d Decision
		if d, s, recent = Decide(s, recent, t0, p, 1, i); d.Admitted != (i < 101) {
			t.Fatalf("job %d admitted %v", i, d.Admitted)
		}
	}
	if d, _, _ := Decide(s, recent, t0, p, 1, 101); d.Admitted {
		t.Fatal("a 102nd waiting job admitted at capacity 100")
	}
	for i, slot := range slots {
		want := time.Duration(i/20)*time.Minute + time.Duration(i%20)*T
		if slot.Sub(t0) != want {
			t.Fatalf("job %d at %v, want %v", i, slot.Sub(t0), want)
		}
	}
	if len(recent[0]) != 20 {
		t.Fatalf("bookkeeping holds %d entries, want N = 20", len(recent[0]))
	}
	for i := range slots {
		for j := i; j < len(slots); j++ {
			if slots[j].Sub(slots[i]) < time.Minute && j-i+1 > 20 {
				t.Fatalf("%d sends within %v", j-i+1, slots[j].Sub(slots[i]))
			}
		}
	}
}

func TestParseWindow(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]Window{"100/h": {N: 100, Length: time.Hour}, "1000/d": {N: 1000, Length: Day}, " 5 / 10s ": {N: 5, Length: 10 * time.Second}} {
		w, err := ParseWindow(s)
		if err != nil || w.N != want.N || w.Length != want.Length {
			t.Fatalf("%q: %+v %v", s, w, err)
		}
	}
	for _, s := range []string{"0/h", "1.5/h", "100", "100/0s", "-1/h", "100/x"} {
		if _, err := ParseWindow(s); err == nil {
			t.Fatalf("%q accepted", s)
		}
	}
}

// In token mode a job the rate refuses is told when it can go at once: a
// full window may refuse it for longer than the rate does.
func TestTokenRetryAfterCountsTheWindows(t *testing.T) {
	t.Parallel()
	w, err := ParseWindow("1/1s")
	if err != nil {
		t.Fatal(err)
	}
	T := 50 * time.Millisecond
	p := Policy{Interval: T, Burst: 1, Windows: []Window{w}}
	d, s, recent := Decide(State{}, nil, t0, p, 1, 0)
	if !d.Admitted {
		t.Fatalf("first job: %+v", d)
	}
	now := t0.Add(10 * time.Millisecond) // the rate refuses for 40 ms, the window for 990 ms
	d, _, _ = Decide(s, recent, now, p, 1, 0)
	if d.Admitted || d.RetryAfter != 990*time.Millisecond {
		t.Fatalf("second job: %+v, want refused with Retry-After 990ms", d)
	}
	ra := d.RetryAfter
	if d, _, _ = Decide(s, recent, now.Add(ra), p, 1, 0); !d.Admitted {
		t.Fatalf("sent again at its Retry-After: %+v, want admitted", d)
	}
	if d, _, _ = Decide(s, recent, now.Add(ra-time.Microsecond), p, 1, 0); d.Admitted {
		t.Fatal("admitted a moment before its Retry-After")
	}
}
