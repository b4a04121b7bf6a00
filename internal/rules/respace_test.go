package rules

import (
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// After a restart, jobs whose time passed are moved from the later of now
// and the last send's next, one interval apart; after a crash the first
// moved job comes an interval after now (one overdue job may have been
// written just before), and the schedule gets no burst credit.
func TestRespace(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 3, Capacity: 10}
	overdue := func() []Placed {
		return []Placed{{Slot: t0.Add(-300 * ms), ID: "a"}, {Slot: t0.Add(-200 * ms), ID: "b", Cost: 2}, {Slot: t0.Add(time.Second), ID: "c"}}
	}
	for _, tc := range []struct {
		name  string
		clean bool
		rec   Record
		want  []time.Duration // new slots from t0, or the old ones
		moved int
		tat   time.Duration
	}{
		{"clean", true, Record{}, []time.Duration{0, 100 * ms, time.Second}, 2, 300 * ms},
		{"crash", false, Record{}, []time.Duration{200 * ms, 300 * ms, time.Second}, 2, 700 * ms},
		{"clean, a late last send", true, Record{LastAttemptAt: t0.Add(50 * ms)}, []time.Duration{150 * ms, 250 * ms, time.Second}, 2, 450 * ms},
		{"clean, held", true, Record{Pause: leaky.Pause{Held: t0.Add(-time.Second)}}, []time.Duration{-300 * ms, -200 * ms, time.Second}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			jobs := overdue()
			if moved := Respace(&rec, jobs, p, t0, tc.clean); moved != tc.moved {
				t.Fatalf("moved %d, want %d", moved, tc.moved)
			}
			for i, w := range jobs {
				if !w.Slot.Equal(t0.Add(tc.want[i])) {
					t.Fatalf("job %s at %v, want t0%+v", w.ID, w.Slot.Sub(t0), tc.want[i])
				}
			}
			if tc.moved > 0 && !rec.TAT.Equal(t0.Add(tc.tat)) {
				t.Fatalf("TAT t0%+v, want t0%+v", rec.TAT.Sub(t0), tc.tat)
			}
		})
	}
}

// A moved job keeps within its windows, and the old slots still count: they
// may have been sent.
func TestRespaceKeepsTheWindows(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 2, Length: time.Second}}}
	var rec Record
	rec.SetRecent(p, []leaky.Recent{{t0.Add(-900 * ms), t0.Add(-800 * ms)}})
	jobs := []Placed{{Slot: t0.Add(-100 * ms), ID: "a"}}
	Respace(&rec, jobs, p, t0, true)
	if want := t0.Add(100 * ms); !jobs[0].Slot.Equal(want) {
		t.Fatalf("moved to t0%+v, want t0+100ms (the window of the sends at -900ms and -800ms)", jobs[0].Slot.Sub(t0))
	}
}
