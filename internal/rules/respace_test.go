package rules

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// restart is the embedded store's handover at t0.
func restart(clean bool) func(Record, []Placed) Pickup {
	return func(rec Record, jobs []Placed) Pickup { return RestartPickup(rec, jobs, t0, t0, clean) }
}

// takeover is a new Redis owner's handover at t0 that took back a job of
// cost lost (0: none).
func takeover(lost int) func(Record, []Placed) Pickup {
	return func(Record, []Placed) Pickup { return Pickup{Now: t0, Lost: lost} }
}

// Jobs whose time passed are moved from the later of now, the last send's
// next and a lost send's cost after now, one job's cost apart. A held
// tenant's jobs move only for a lost send, past its frozen clock; a pause
// that ends after the floor holds them as they are.
func TestRespace(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 10}
	overdue := func() []Placed {
		return []Placed{{Slot: t0.Add(-300 * ms), ID: "a"}, {Slot: t0.Add(-200 * ms), ID: "b", Cost: 2}, {Slot: t0.Add(time.Second), ID: "c"}}
	}
	heldJustBefore := leaky.Pause{}.Hold(t0.Add(-100 * ms))
	for _, tc := range []struct {
		name  string
		rec   Record
		h     func(Record, []Placed) Pickup
		want  []time.Duration // new slots from t0, or the old ones
		moved int
	}{
		{"clean", Record{}, restart(true), []time.Duration{0, 100 * ms, time.Second}, 2},
		// One of them may have been written just before the crash: the
		// first goes the largest overdue cost after now.
		{"crash", Record{}, restart(false), []time.Duration{200 * ms, 300 * ms, time.Second}, 2},
		{"clean, a late last send", Record{LastAttemptAt: t0.Add(50 * ms)}, restart(true), []time.Duration{150 * ms, 250 * ms, time.Second}, 2},
		{"clean, held", Record{Pause: leaky.Pause{Held: t0.Add(-time.Second)}}, restart(true), []time.Duration{-300 * ms, -200 * ms, time.Second}, 0},
		// Due when held, they may have been written: past the frozen
		// clock by the largest of their costs.
		{"crash, held", Record{Pause: heldJustBefore}, restart(false), []time.Duration{100 * ms, 200 * ms, time.Second}, 2},
		{"takeover, a send lost", Record{}, takeover(1), []time.Duration{100 * ms, 200 * ms, time.Second}, 2},
		{"takeover, nothing lost", Record{}, takeover(0), []time.Duration{0, 100 * ms, time.Second}, 2},
		// The last attempt's cost counts from the frozen clock too: the
		// resume may come at once.
		{"takeover, held, a send lost", Record{Pause: heldJustBefore, LastAttemptCost: 3}, takeover(1), []time.Duration{200 * ms, 300 * ms, time.Second}, 2},
		{"takeover, held, nothing lost", Record{Pause: heldJustBefore}, takeover(0), []time.Duration{-300 * ms, -200 * ms, time.Second}, 0},
		{"takeover, paused past the floor", Record{Pause: leaky.Pause{}.PauseUntil(t0, t0.Add(500*ms), time.Time{})}, takeover(2), []time.Duration{-300 * ms, -200 * ms, time.Second}, 0},
		// A pause that ends before a lost send's floor: the jobs go from
		// the floor (real t0+200ms, tenant time 50ms behind), not at the
		// pause's end 50 ms after a send that may have been written at t0.
		{"takeover, a pause ending before the floor", Record{Pause: leaky.Pause{}.PauseUntil(t0, t0.Add(50*ms), time.Time{})}, takeover(2), []time.Duration{150 * ms, 250 * ms, time.Second}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			jobs := overdue()
			if moved := Respace(&rec, jobs, p, tc.h(rec, jobs)); moved != tc.moved {
				t.Fatalf("moved %d, want %d", moved, tc.moved)
			}
			for i, w := range jobs {
				if !w.Slot.Equal(t0.Add(tc.want[i])) {
					t.Fatalf("job %s at t0%+v, want t0%+v", w.ID, w.Slot.Sub(t0), tc.want[i])
				}
			}
		})
	}
}

// Moved jobs keep the burst's credit only if no send can have gone
// unrecorded: a clean restart. After a crash, or at any takeover, the
// schedule runs a tolerance past them.
func TestRespaceBurstCredit(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 10}
	for _, tc := range []struct {
		name string
		h    func(Record, []Placed) Pickup
		tat  time.Duration
	}{
		{"clean", restart(true), 300 * ms},
		{"crash", restart(false), 700 * ms},
		{"takeover", takeover(0), 500 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			jobs := []Placed{{Slot: t0.Add(-300 * ms), ID: "a"}, {Slot: t0.Add(-200 * ms), ID: "b", Cost: 2}}
			Respace(&rec, jobs, p, tc.h(rec, jobs))
			if !rec.TAT.Equal(t0.Add(tc.tat)) {
				t.Fatalf("TAT t0%+v, want t0%+v", rec.TAT.Sub(t0), tc.tat)
			}
		})
	}
}

// The schedule runs a cost past the last job waiting, moved or not (after a
// reload to a slower rate it is a new interval past it), but not past a
// booked retry: the jobs admitted are placed around that.
func TestRespaceRunsPastTheLastJob(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	jobs := []Placed{{Slot: t0.Add(time.Second), ID: "x", Cost: 2}, {Slot: t0.Add(1500 * ms), ID: "y"}}
	var rec Record
	Respace(&rec, jobs, p, Pickup{Now: t0})
	if want := t0.Add(1600 * ms); !rec.TAT.Equal(want) {
		t.Fatalf("TAT t0%+v, want t0+1.6s (a cost past y)", rec.TAT.Sub(t0))
	}
	rec = Record{Booked: []Booking{{Slot: jobs[1].Slot.UnixNano(), Job: "y"}}}
	Respace(&rec, jobs, p, Pickup{Now: t0})
	if want := t0.Add(1200 * ms); !rec.TAT.Equal(want) {
		t.Fatalf("TAT t0%+v, want t0+1.2s (a cost past x: y is booked)", rec.TAT.Sub(t0))
	}
}

// With or without jobs, the schedule starts no sooner than the next send
// with no burst credit, by the last attempt or the handover's next.
func TestRespaceFloorsTheNextSend(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 10}
	for _, tc := range []struct {
		name string
		rec  Record
		next time.Time
		tat  time.Time
	}{
		{"last attempt", Record{LastAttemptAt: t0.Add(-50 * ms)}, time.Time{}, t0.Add(250 * ms)},
		{"next", Record{LastAttemptAt: t0.Add(-50 * ms)}, t0.Add(120 * ms), t0.Add(320 * ms)},
		{"long past", Record{LastAttemptAt: t0.Add(-time.Second)}, time.Time{}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			Respace(&rec, nil, p, Pickup{Now: t0, Next: tc.next})
			if !rec.TAT.Equal(tc.tat) {
				t.Fatalf("TAT %v, want %v", rec.TAT, tc.tat)
			}
		})
	}
}

// A moved job keeps within its windows: the sends made before count.
func TestRespaceKeepsTheWindows(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 2, Length: time.Second}}}
	var rec Record
	for _, at := range []time.Time{t0.Add(-900 * ms), t0.Add(-800 * ms)} {
		rec.CountSend(p, at, 1)
		rec.CountMade(p, at, 1)
	}
	jobs := []Placed{{Slot: t0.Add(-100 * ms), ID: "a"}}
	Respace(&rec, jobs, p, RestartPickup(rec, jobs, t0, t0, true))
	if want := t0.Add(100 * ms); !jobs[0].Slot.Equal(want) {
		t.Fatalf("moved to t0%+v, want t0+100ms (the window of the sends at -900ms and -800ms)", jobs[0].Slot.Sub(t0))
	}
}

// A job's deadline is told when its pause or its tenant's hold may send it
// after it.
func TestMissedDeadline(t *testing.T) {
	deadline := t0.Add(time.Second)
	for _, tc := range []struct {
		name     string
		pz       leaky.Pause
		deadline time.Time
		want     time.Time
	}{
		{"no deadline", leaky.Pause{Held: t0}, time.Time{}, time.Time{}},
		{"in time", leaky.Pause{}, deadline, time.Time{}},
		{"at the deadline", leaky.Pause{Shift: 500 * ms}, deadline, time.Time{}},
		{"paused past it", leaky.Pause{}.PauseUntil(t0, t0.Add(2*time.Second), time.Time{}), deadline, deadline},
		{"held", leaky.Pause{Held: t0}, deadline, deadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MissedDeadline(tc.pz, t0.Add(500*ms), tc.deadline); !got.Equal(tc.want) {
				t.Fatalf("%v, want %v", got, tc.want)
			}
		})
	}
}

// A send that may have been written with no outcome recorded counts in
// its windows at the latest moment it could have been: the restart, or
// the end of the last process's lease on sending if that came first (a
// crash, then a long outage). A job that came due after the lease ended
// was not sent. Here a window of 3 per 10 s holds jobs a (5 s ago), b (3 s
// ago) and c (in 1 s), none recorded sent; they go again in their order.
func TestUnrecordedSendsCountWhenTheyMayHaveGone(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 3, Length: 10 * time.Second}}}
	s := time.Second
	for _, tc := range []struct {
		name       string
		sentBy     time.Time
		unrecorded []string
		at         []time.Duration // a's, b's and c's new slots, from t0
	}{
		// a and b may have gone at t0: a's resend fills the window, b
		// goes once they leave it, and c after b.
		{"restarted within the lease", t0, []string{"a", "b"}, []time.Duration{100 * ms, 10 * s, 10*s + 100*ms}},
		// Only a may have gone, 4 s ago: a and b fill the window with it,
		// and c waits until it leaves.
		{"the lease ended 4 s before the restart", t0.Add(-4 * s), []string{"a"}, []time.Duration{100 * ms, 200 * ms, 6 * s}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobs := []Placed{{Slot: t0.Add(-5 * time.Second), ID: "a"}, {Slot: t0.Add(-3 * time.Second), ID: "b"}, {Slot: t0.Add(time.Second), ID: "c"}}
			var rec Record
			for _, j := range jobs {
				rec.CountSend(p, j.Slot, 1)
			}
			h := RestartPickup(rec, jobs, t0, tc.sentBy, false)
			var ids []string
			for _, u := range h.Unrecorded {
				ids = append(ids, u.ID)
			}
			if fmt.Sprint(ids) != fmt.Sprint(tc.unrecorded) {
				t.Errorf("unrecorded %v, want %v", ids, tc.unrecorded)
			}
			Respace(&rec, jobs, p, h)
			for i, j := range jobs {
				if got := j.Slot.Sub(t0); got != tc.at[i] {
					t.Errorf("%s moved to t0%+v, want t0%+v", j.ID, got, tc.at[i])
				}
			}
		})
	}
}

// A backlog longer than a window's N, after a stop: the window's list then
// holds only sends to come (the backlog's end), and the jobs the stop made
// overdue would be placed a window past it. From the sends made they move
// by the stop, and the backlog behind them with them. Here 3 per second at
// 100 ms, 12 jobs in four groups of three from t0, the first group sent;
// a clean stop makes the second overdue by 300 ms.
func TestRespaceALongBacklogFromTheSendsMade(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 20, Windows: []leaky.Window{{N: 3, Length: time.Second}}}
	now := t0.Add(1300 * ms)
	backlog := func(made bool) (Record, []Placed) {
		var rec Record
		var jobs []Placed
		for g := range 4 {
			for k := range 3 {
				slot := t0.Add(time.Duration(g)*time.Second + time.Duration(k)*100*ms)
				rec.CountSend(p, slot, 1)
				if g == 0 {
					if made {
						rec.CountMade(p, slot, 1)
					}
					continue
				}
				jobs = append(jobs, Placed{Slot: slot, ID: fmt.Sprintf("j%d%d", g, k)})
			}
		}
		rec.TAT = t0.Add(3300 * ms)
		return rec, jobs
	}
	rec, jobs := backlog(true)
	old := slices.Clone(jobs)
	if moved := Respace(&rec, jobs, p, RestartPickup(rec, jobs, now, now, true)); moved != len(jobs) {
		t.Errorf("moved %d, want %d", moved, len(jobs))
	}
	for i, j := range jobs {
		if off := j.Slot.Sub(old[i].Slot); off != 300*ms {
			t.Errorf("%s moved from t0+%v to t0+%v, want 300 ms later", j.ID, old[i].Slot.Sub(t0), j.Slot.Sub(t0))
		}
	}
	if got, want := rec.Recent(p)[0], (leaky.Recent{t0.Add(3300 * ms), t0.Add(3400 * ms), t0.Add(3500 * ms)}); !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("window's list %v, want the backlog's new end", got)
	}
	// Not knowing the sends made (a store written before they were kept),
	// it keeps the old slots as sends and goes past them.
	rec, jobs = backlog(false)
	Respace(&rec, jobs, p, RestartPickup(rec, jobs, now, now, true))
	if first := jobs[0].Slot; first.Before(t0.Add(4 * time.Second)) {
		t.Errorf("with the sends made unknown the first job went at t0+%v, want after the backlog's end", first.Sub(t0))
	}
}

// BenchmarkRespaceAWindowedBacklog places anew, at a restart, 20,000 jobs
// of a tenant with a window of 1000 per hour (twenty hours of backlog)
// from a send made a minute before: what a restart or a takeover (its Lua
// twin) spends on such a tenant.
//
//	go test -run '^$' -bench RespaceAWindowedBacklog ./internal/rules
func BenchmarkRespaceAWindowedBacklog(b *testing.B) {
	w := mustWindow(b, "1000/h")
	p := leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 1_000_000, Windows: []leaky.Window{w}}
	backlog := make([]Placed, 20_000)
	for i := range backlog {
		backlog[i] = Placed{Slot: t0.Add(time.Duration(i/1000)*time.Hour + time.Duration(i%1000)*time.Millisecond), ID: fmt.Sprint(i)}
	}
	for range b.N {
		var rec Record
		rec.SetRecent(p, []leaky.Recent{{backlog[len(backlog)-1].Slot}})
		rec.CountMade(p, t0.Add(-time.Minute), 1)
		jobs := slices.Clone(backlog)
		now := t0.Add(time.Second)
		Respace(&rec, jobs, p, RestartPickup(rec, jobs, now, now, true))
	}
}
