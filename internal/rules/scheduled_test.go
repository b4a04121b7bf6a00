package rules

import (
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// A job with a not_before past its place in the queue is booked at it:
// the schedule's end stays, a second one for the same time goes one
// interval after, one in a window goes when the window has room, prompt
// jobs go around the bookings, max_scheduled refuses one more, a deadline
// before the booking refuses it whatever the room, a held tenant's job is
// booked as if resumed now, and a not_before its place passes is an
// ordinary job.
func TestAdmitScheduled(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 5, MaxScheduled: 3}
	var rec Record
	q := &slots{}
	call := func(nb time.Duration, job string) Call {
		c := Call{Now: t0, Arrival: t0, Policy: p, Cost: 1, Job: job}
		if nb != 0 {
			c.NotBefore = t0.Add(nb)
		}
		return c
	}
	admit := func(c Call) Decision {
		d := Admit(&rec, q, c)
		switch {
		case d.Verdict == Admitted && d.Scheduled:
			q.booked++
		case d.Verdict == Admitted:
			q.deciding = append(q.deciding, d.Slot)
		}
		return d
	}
	if d := admit(call(time.Second, "a")); d.Verdict != Admitted || !d.Scheduled || !d.Slot.Equal(t0.Add(time.Second)) || d.Delay != time.Second || !rec.TAT.IsZero() {
		t.Fatalf("booked at +1s: %+v, TAT %v", d, rec.TAT)
	}
	if d := admit(call(time.Second, "b")); !d.Scheduled || !d.Slot.Equal(t0.Add(1100*ms)) {
		t.Fatalf("a second at +1s: %+v, want +1.1s", d)
	}
	// Prompt jobs fill the queue as if nothing were booked; one at +850ms
	// goes then (a whole interval before the first booking), one at
	// +950ms would crowd it and goes after the two.
	for i := range 9 {
		if d := admit(call(0, "")); d.Verdict != Admitted && i < 6 {
			t.Fatalf("prompt job %d: %+v", i, d)
		}
	}
	q.deciding = q.deciding[:0] // sent
	for _, c := range []struct{ at, want time.Duration }{{850 * ms, 850 * ms}, {950 * ms, 1200 * ms}} {
		r := rec
		if d := Admit(&r, q, Call{Now: t0.Add(c.at), Arrival: t0.Add(c.at), Policy: p, Cost: 1}); !d.Slot.Equal(t0.Add(c.want)) {
			t.Errorf("a prompt job at +%v beside the bookings at +1s and +1.1s: slot +%v, want +%v", c.at, d.Slot.Sub(t0), c.want)
		}
	}
	late := call(3*time.Second, "c")
	late.Deadline = t0.Add(2 * time.Second)
	if d := admit(late); d.Verdict != WouldExpire {
		t.Errorf("a deadline before its not_before: %+v", d)
	}
	if d := admit(call(3*time.Second, "c")); !d.Scheduled {
		t.Fatalf("a third: %+v", d)
	}
	rejected := rec.Rejected
	if d := admit(call(4*time.Second, "d")); d.Verdict != ScheduleFull || rec.Rejected != rejected+1 {
		t.Errorf("a fourth with max_scheduled 3: %+v", d)
	}
	if d := admit(call(50*ms, "e")); d.Scheduled {
		t.Errorf("a not_before its place in the queue passes: %+v, want an ordinary job", d)
	}

	// Held since t0-1s: booked as if resumed now, at its not_before.
	held := Record{Pause: leaky.Pause{Held: t0.Add(-time.Second)}}
	if d := Admit(&held, &slots{}, call(2*time.Second, "h")); !d.Scheduled || !d.DispatchAt.Equal(t0.Add(2*time.Second)) {
		t.Errorf("held: %+v, want it due at +2s if resumed now", d)
	}
	// A partition with no sender until +5s, which sends the job ahead
	// first: booked an interval after it, not on it.
	owned := Record{}
	ahead := &slots{}
	first := Admit(&owned, ahead, Call{Now: t0, Arrival: t0, Policy: p, Cost: 1, OwnerAt: t0.Add(5 * time.Second)})
	ahead.deciding = append(ahead.deciding, first.Slot)
	if d := Admit(&owned, ahead, Call{Now: t0, Arrival: t0, Policy: p, Cost: 1, OwnerAt: t0.Add(5 * time.Second), NotBefore: t0.Add(time.Second), Job: "o"}); !first.Slot.Equal(t0.Add(5*time.Second)) || !d.Scheduled || !d.Slot.Equal(t0.Add(5*time.Second+100*ms)) {
		t.Errorf("with no sender until +5s: the job ahead at +%v, the booked one %+v, want +5s and +5.1s", first.Slot.Sub(t0), d)
	}
	// A window full until +5s: booked when it has room.
	w := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 5, Windows: []leaky.Window{{N: 2, Length: 5 * time.Second}}}
	var wrec Record
	wrec.CountSend(w, t0, 1)
	wrec.CountSend(w, t0.Add(100*ms), 1)
	if d := Admit(&wrec, &slots{}, Call{Now: t0, Arrival: t0, Policy: w, Cost: 1, NotBefore: t0.Add(time.Second), Job: "w"}); !d.Scheduled || !d.Slot.Equal(t0.Add(5*time.Second)) {
		t.Errorf("in a full window: %+v, want it booked at +5s", d)
	}
}
