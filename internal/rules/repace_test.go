package rules

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// A change of policy places the waiting backlog anew: from now (or the
// next send by the last attempt, or after the jobs handed over), one
// interval of the new rate apart, with no burst credit; faster brings it
// forward, slower moves it back; a job admitted after goes behind it; a
// booked retry keeps its booking; a paused tenant is left as it is.
func TestRepace(t *testing.T) {
	fast := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 100}
	// Four jobs admitted under slow, the first due now.
	backlog := func() []Placed {
		var jobs []Placed
		for i := range 4 {
			jobs = append(jobs, Placed{Slot: t0.Add(time.Duration(i) * 500 * ms), ID: fmt.Sprint("j", i)})
		}
		return jobs
	}
	slowRec := func() Record { return Record{TAT: t0.Add(2 * time.Second)} }
	for _, tc := range []struct {
		name  string
		rec   Record
		p     leaky.Policy
		after time.Time
		want  []time.Duration // from t0
		moved int
		tat   time.Duration // the next admission's slot, from t0
	}{
		{"faster", slowRec(), fast, time.Time{}, []time.Duration{0, 100 * ms, 200 * ms, 300 * ms}, 3, 400 * ms},
		{"faster, after a job handed over", slowRec(), fast, t0.Add(100 * ms), []time.Duration{100 * ms, 200 * ms, 300 * ms, 400 * ms}, 4, 500 * ms},
		{"faster, a send just made", Record{TAT: t0.Add(2 * time.Second), LastAttemptAt: t0.Add(-50 * ms)}, fast, time.Time{}, []time.Duration{50 * ms, 150 * ms, 250 * ms, 350 * ms}, 4, 450 * ms},
		{"slower", Record{TAT: t0.Add(400 * ms)}, leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 100}, time.Time{}, []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second}, 3, 4 * time.Second},
		{"paused", Record{TAT: t0.Add(2 * time.Second), Pause: leaky.Pause{}.PauseUntil(t0, t0.Add(time.Second), time.Time{})}, fast, time.Time{}, []time.Duration{0, 500 * ms, time.Second, 1500 * ms}, 0, -1},
		// j1 is a retry booked at its backoff's end: it stays there, and the
		// others go around it.
		{"a booked retry", Record{TAT: t0.Add(2 * time.Second), Booked: []Booking{{Slot: t0.Add(500 * ms).UnixNano(), Job: "j1"}}}, fast, time.Time{}, []time.Duration{0, 500 * ms, 100 * ms, 200 * ms}, 2, 300 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, jobs := tc.rec, backlog()
			moved := Repace(&rec, jobs, tc.p, t0, tc.after, nil)
			var got []time.Duration
			for _, j := range jobs {
				got = append(got, j.Slot.Sub(t0))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || moved != tc.moved {
				t.Fatalf("slots %v, %d moved; want %v, %d", got, moved, tc.want, tc.moved)
			}
			if tc.tat < 0 {
				return
			}
			q := &slots{}
			for _, j := range jobs {
				q.scheduled = append(q.scheduled, j.Slot)
			}
			d := Admit(&rec, q, Call{Now: t0, Arrival: t0, Policy: tc.p})
			if next := d.Slot.Sub(t0); next != tc.tat {
				t.Errorf("a job admitted after goes at %v; want %v, behind the backlog", next, tc.tat)
			}
		})
	}
}

// A job admitted with a not_before (its place came after it then) is not
// brought before it by a faster policy: it is booked at its not_before,
// as a retry at its backoff's end, and the jobs behind go around it; a
// second change keeps the booking.
func TestRepaceKeepsANotBefore(t *testing.T) {
	fast := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 100}
	var jobs []Placed
	for i := range 4 {
		jobs = append(jobs, Placed{Slot: t0.Add(time.Duration(i) * 500 * ms), ID: fmt.Sprint("j", i)})
	}
	jobs[2].NotBefore = t0.Add(900 * ms) // its place, 1 s, came after it
	rec := Record{TAT: t0.Add(2 * time.Second)}
	if moved := Repace(&rec, jobs, fast, t0, time.Time{}, nil); moved != 3 {
		t.Errorf("%d moved; want 3 (j1, j2 to its not_before, j3)", moved)
	}
	var got []time.Duration
	for _, j := range jobs {
		got = append(got, j.Slot.Sub(t0))
	}
	// j2 at its not_before; j3 after j2's place in the line (taken, as a
	// booked retry's is), well before j2's booking.
	if want := []time.Duration{0, 100 * ms, 900 * ms, 300 * ms}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("slots %v; want %v", got, want)
	}
	if !rec.IsBooked("j2") {
		t.Fatalf("j2 is not booked at its not_before: %+v", rec.Booked)
	}
	if moved := Repace(&rec, jobs, leaky.Policy{Interval: 10 * ms, Burst: 1, Capacity: 100}, t0, time.Time{}, nil); moved != 2 || !jobs[2].Slot.Equal(t0.Add(900*ms)) {
		t.Fatalf("a second change moved %d and j2 to %v; want 2 moved, j2 kept at 900ms", moved, jobs[2].Slot.Sub(t0))
	}
}

// A job booked for its not_before keeps its slot, and the backlog placed
// anew goes around it, also when the queue had reached it (its booking
// absorbed into the schedule).
func TestRepaceGoesAroundScheduledJobs(t *testing.T) {
	fast := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 100}
	for _, absorbed := range []bool{false, true} {
		var jobs []Placed
		for i := range 4 {
			jobs = append(jobs, Placed{Slot: t0.Add(time.Duration(i) * 500 * ms), ID: fmt.Sprint("j", i)})
		}
		jobs = append(jobs, Placed{Slot: t0.Add(200 * ms), ID: "s", Scheduled: true})
		rec := Record{TAT: t0.Add(2 * time.Second)}
		if !absorbed {
			rec.Booked = []Booking{{Slot: t0.Add(200 * ms).UnixNano(), Job: "s"}}
		}
		Repace(&rec, jobs, fast, t0, time.Time{}, nil)
		var got []time.Duration
		for _, j := range jobs {
			got = append(got, j.Slot.Sub(t0))
		}
		if want := []time.Duration{0, 100 * ms, 300 * ms, 400 * ms, 200 * ms}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("absorbed %v: slots %v; want %v (around s, at 200ms)", absorbed, got, want)
		}
	}
}

// The backlog's old places leave a window's list, so that a faster
// policy brings it forward within the window; a full list keeps them (the
// sends before have left it), so that no window holds more than it allows.
func TestRepaceKeepsTheWindows(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 100, Windows: []leaky.Window{mustWindow(t, "3/s")}}
	jobs := []Placed{{Slot: t0, ID: "a"}, {Slot: t0.Add(500 * ms), ID: "b"}}
	rec := Record{TAT: t0.Add(time.Second)}
	rec.SetRecent(p, []leaky.Recent{{t0, t0.Add(500 * ms)}})
	Repace(&rec, jobs, p, t0, time.Time{}, nil)
	if jobs[1].Slot.Sub(t0) != 100*ms {
		t.Errorf("b at %v; want 100ms: its old place left the window", jobs[1].Slot.Sub(t0))
	}
	// Full: three sends in the last second, the latest two the backlog's.
	full := Record{TAT: t0.Add(time.Second)}
	full.SetRecent(p, []leaky.Recent{{t0.Add(-800 * ms), t0, t0.Add(500 * ms)}})
	jobs = []Placed{{Slot: t0, ID: "a"}, {Slot: t0.Add(500 * ms), ID: "b"}}
	Repace(&full, jobs, p, t0, time.Time{}, nil)
	for _, j := range jobs {
		if j.Slot.Before(t0.Add(200 * ms)) {
			t.Errorf("%s at %v: a full window's list cannot tell the sends before from the backlog's", j.ID, j.Slot.Sub(t0))
		}
	}
}

// Where the sends made are known, a backlog placed anew counts them and the
// jobs handed over, not the backlog's old places, even when a window's
// list is full of those: here a send made 800 ms ago, one handed over
// 100 ms ago, and three jobs at +1 s, +1.1 s and +2 s that a window of 3
// per second lets go at 0, +200 ms (when the send made leaves it) and
// +900 ms (when the handed one does).
func TestRepaceCountsTheSendsMade(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 100, Windows: []leaky.Window{mustWindow(t, "3/s")}}
	slots := []time.Duration{time.Second, 1100 * ms, 2 * time.Second}
	for _, handed := range []bool{true, false} {
		var jobs []Placed
		rec := Record{TAT: t0.Add(2100 * ms)}
		for i, d := range slots {
			jobs = append(jobs, Placed{Slot: t0.Add(d), ID: fmt.Sprint("j", i)})
			rec.CountSend(p, t0.Add(d), 1)
		}
		rec.CountMade(p, t0.Add(-800*ms), 1)
		var h []Placed
		want := []time.Duration{0, 200 * ms, 900 * ms}
		if handed {
			h = []Placed{{Slot: t0.Add(-100 * ms), ID: "h"}}
		} else {
			want = []time.Duration{0, 100 * ms, 200 * ms}
		}
		Repace(&rec, jobs, p, t0, time.Time{}, h)
		var got []time.Duration
		for _, j := range jobs {
			got = append(got, j.Slot.Sub(t0))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("handed over %v: slots %v, want %v", handed, got, want)
		}
	}
}
