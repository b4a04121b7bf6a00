package rules

import (
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// slots is a tenant's jobs as a test lays them out: scheduled waiting,
// not yet durable (deciding), and handed over.
type slots struct {
	scheduled, deciding, handed []time.Time
	booked                      int // jobs booked for their not_before
}

func (q *slots) Depth() int { return len(q.scheduled) + len(q.deciding) }

func (q *slots) Waiting(yield func(time.Time, bool)) {
	for _, s := range q.scheduled {
		yield(s, true)
	}
	for _, s := range q.deciding {
		yield(s, false)
	}
}

func (q *slots) Scheduled() int { return q.booked }

func (q *slots) HandedOver(yield func(time.Time)) {
	for _, s := range q.handed {
		yield(s)
	}
}

// burst admits n jobs arriving together at t0 (each, once admitted, joins
// the call's jobs not yet durable, as a batch does) and counts verdicts.
func burst(rec *Record, q *slots, p leaky.Policy, n int) (admitted, refused int, last Decision) {
	for range n {
		last = Admit(rec, q, Call{Now: t0, Arrival: t0, Policy: p, Cost: 1})
		switch last.Verdict {
		case Admitted:
			admitted++
			q.deciding = append(q.deciding, last.Slot)
		case Refused:
			refused++
		}
	}
	return admitted, refused, last
}

// DESIGN's examples: after a quiet spell, a burst of 30 with capacity 10
// has 11 accepted in leaky mode, 10 with burst 10 in token mode, and 10 + 1
// with both (burst 10 at once, then... capacity waits).
func TestAdmitBurstsAsDesignSays(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    leaky.Policy
		want int
	}{
		{"leaky", leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}, 11},
		{"token", leaky.Policy{Interval: 100 * ms, Burst: 10}, 10},
		{"both", leaky.Policy{Interval: 100 * ms, Burst: 5, Capacity: 10}, 15},
		{"leaky with a window", leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 5, Length: time.Second}}}, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			got, refused, _ := burst(&rec, &slots{}, tc.p, 30)
			if got != tc.want || refused != 30-tc.want {
				t.Fatalf("admitted %d, refused %d; want %d admitted", got, refused, tc.want)
			}
			if rec.Accepted != int64(got) || rec.Rejected != int64(refused) {
				t.Fatalf("record counts %d accepted, %d rejected", rec.Accepted, rec.Rejected)
			}
		})
	}
}

// A job waits its turn: slot, dispatch time, delay, promptness, and the
// refusal's Retry-After is the time until the same job is admitted.
func TestAdmitPlacesAndRefuses(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 2}
	var rec Record
	q := &slots{}
	steps := []struct {
		verdict Verdict
		slot    time.Duration // from t0 (admitted)
		retry   time.Duration // refused
		prompt  bool
	}{
		{Admitted, 0, 0, true},
		{Admitted, 100 * ms, 0, false},
		{Admitted, 200 * ms, 0, false},
		{Refused, 0, 100 * ms, false},
	}
	for i, st := range steps {
		d := Admit(&rec, q, Call{Now: t0, Arrival: t0, Policy: p})
		if d.Verdict != st.verdict || d.Prompt != st.prompt {
			t.Fatalf("job %d: %+v, want %v prompt %v", i, d, st.verdict, st.prompt)
		}
		if d.Verdict == Admitted {
			if !d.Slot.Equal(t0.Add(st.slot)) || !d.DispatchAt.Equal(d.Slot) || d.Delay != st.slot || d.Depth != len(q.deciding)+len(q.scheduled) {
				t.Fatalf("job %d: %+v, want slot t0+%v", i, d, st.slot)
			}
			q.deciding = append(q.deciding, d.Slot)
		} else if d.RetryAfter != st.retry {
			t.Fatalf("job %d: Retry-After %v, want %v", i, d.RetryAfter, st.retry)
		}
	}
	if want := t0.Add(300 * ms); !rec.TAT.Equal(want) {
		t.Fatalf("TAT %v, want %v", rec.TAT, want)
	}
}

// A refusal by rate counts from now, not from the arrival a start lag
// ahead: the lag may fall before the job comes back.
func TestRefusalCountsTheLag(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 0}
	rec := Record{TAT: t0.Add(100 * ms)}
	d := Admit(&rec, &slots{}, Call{Now: t0, Arrival: t0.Add(5 * ms), Policy: p})
	if d.Verdict != Refused || d.RetryAfter != 100*ms {
		t.Fatalf("%+v, want refused for 100ms (95ms from the arrival, plus the 5ms lag)", d)
	}
}

// A job in the schedule due by the arrival leaves the count as the
// dispatcher takes it: a dispatcher a little late must not refuse a job
// while the queue has room. A job not yet durable counts whole, and so
// does every job while paused or under a cap.
func TestDueJobsLeaveTheCount(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 1}
	for _, tc := range []struct {
		name string
		q    slots
		rec  Record
		want Verdict
	}{
		{"due in the schedule", slots{scheduled: []time.Time{t0.Add(-10 * ms), t0.Add(50 * ms)}}, Record{TAT: t0.Add(100 * ms)}, Admitted},
		{"due, not yet durable", slots{deciding: []time.Time{t0.Add(-10 * ms), t0.Add(50 * ms)}}, Record{TAT: t0.Add(100 * ms)}, Refused},
		{"due while paused", slots{scheduled: []time.Time{t0.Add(-10 * ms), t0.Add(50 * ms)}},
			Record{TAT: t0.Add(100 * ms), Pause: leaky.Pause{Until: t0.Add(time.Second), Shift: time.Second}}, Refused},
		// A cap on attempts in flight may hold a due job past its slot.
		{"due under a cap", slots{scheduled: []time.Time{t0.Add(-10 * ms), t0.Add(50 * ms)}}, Record{TAT: t0.Add(100 * ms)}, Refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			if d := Admit(&rec, &tc.q, Call{Now: t0, Arrival: t0, Policy: p, Capped: tc.name == "due under a cap"}); d.Verdict != tc.want {
				t.Fatalf("%+v, want %v", d, tc.want)
			}
		})
	}
}

// A job that would go after its deadline is refused for good, and the
// record keeps nothing of it.
func TestWouldExpireKeepsNothing(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	rec := Record{TAT: t0.Add(500 * ms)}
	before := rec
	d := Admit(&rec, &slots{scheduled: make([]time.Time, 5)}, Call{Now: t0, Arrival: t0, Policy: p, Deadline: t0.Add(300 * ms)})
	if d.Verdict != WouldExpire || d.Delay != 500*ms {
		t.Fatalf("%+v, want would_expire with its 500ms delay", d)
	}
	if rec.TAT != before.TAT || rec.Accepted != 0 || rec.Rejected != 0 {
		t.Fatalf("record changed: %+v", rec)
	}
}

// Behind a downstream's ceiling, a job waits at least for the jobs ahead of
// it at the ceiling's pace, even when its own rate is faster.
func TestCeilingDelay(t *testing.T) {
	p := leaky.Policy{Interval: 50 * ms, Burst: 1, Capacity: 10}
	ceiling := &leaky.Policy{Interval: 200 * ms, Burst: 1}
	var rec Record
	q := &slots{}
	for i := range 4 {
		d := Admit(&rec, q, Call{Now: t0, Arrival: t0, Policy: p, Ceiling: ceiling})
		if want := time.Duration(i) * 200 * ms; d.Verdict != Admitted || d.Delay != want {
			t.Fatalf("job %d: %+v, want a delay of %v", i, d, want)
		}
		q.deciding = append(q.deciding, d.Slot)
	}
}

// While a tenant's partition has no sender, its jobs are promised from
// when it gets one, one interval apart behind those ahead; a held tenant is
// moved by its hold instead.
func TestOwnerAtMovesThePromise(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	var rec Record
	q := &slots{scheduled: []time.Time{t0.Add(-time.Second)}}
	d := Admit(&rec, q, Call{Now: t0, Arrival: t0, Policy: p, OwnerAt: t0.Add(400 * ms)})
	if want := t0.Add(500 * ms); d.Verdict != Admitted || !d.DispatchAt.Equal(want) || !d.Slot.Equal(want) || d.Prompt {
		t.Fatalf("%+v, want dispatch at %v (one ahead), not prompt", d, want)
	}
	if list := rec.Windows; list != nil {
		t.Fatalf("windows %v without windows", list)
	}
}

// A hand retry of a failed job is not a new acceptance, and the job is no
// longer failed while it waits again; a refused one still is.
func TestResendIsNotCounted(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	rec := Record{Accepted: 3, Failed: 2}
	if d := Admit(&rec, &slots{}, Call{Now: t0, Arrival: t0, Policy: p, Resend: true}); d.Verdict != Admitted || rec.Accepted != 3 || rec.Failed != 1 {
		t.Fatalf("%+v, accepted %d failed %d, want 3 and 1", d, rec.Accepted, rec.Failed)
	}
	full := &slots{deciding: make([]time.Time, 12)}
	if d := Admit(&rec, full, Call{Now: t0, Arrival: t0, Policy: p, Resend: true}); d.Verdict != Refused || rec.Failed != 1 {
		t.Fatalf("%+v, failed %d, want refused and 1", d, rec.Failed)
	}
}

// The expected delay is the wait a job admitted now would have, windows,
// bookings and ceiling counted.
func TestExpectedDelay(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 2, Length: time.Second}}}
	rec := Record{TAT: t0.Add(200 * ms)}
	rec.SetRecent(p, []leaky.Recent{{t0.Add(-500 * ms), t0.Add(100 * ms)}})
	if got, want := ExpectedDelay(rec, t0, p, nil, 2, time.Time{}), 500*ms; got != want {
		t.Fatalf("expected delay %v, want %v (the window frees at t0+500ms)", got, want)
	}
	ceiling := &leaky.Policy{Interval: 400 * ms, Burst: 1}
	if got, want := ExpectedDelay(rec, t0, p, ceiling, 2, time.Time{}), 800*ms; got != want {
		t.Fatalf("behind a ceiling: %v, want %v", got, want)
	}
}

// While an operator hold is on, nothing leaves the queue until someone
// resumes it, which no clock says: a refusal then asks for no retry
// sooner than HeldRetryAfter (a client that obeys would spin on the
// as-if-resumed-now answer, 0 for a queue due already). A timed pause
// says when it ends, and a refusal counts to then as before.
func TestHeldRefusalPromisesNoSoonRetry(t *testing.T) {
	leakyP := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 2}
	tokenP := leaky.Policy{Interval: 100 * ms, Burst: 3}
	held := leaky.Pause{}.Hold(t0.Add(-time.Hour))
	for _, tc := range []struct {
		name  string
		p     leaky.Policy
		pause leaky.Pause
		q     slots
		want  time.Duration
	}{
		{"held, a full queue due already", leakyP, held, slots{scheduled: []time.Time{t0.Add(-2 * time.Hour), t0.Add(-2 * time.Hour)}}, HeldRetryAfter},
		{"held, a full queue due soon", leakyP, held, slots{scheduled: []time.Time{t0.Add(-time.Hour), t0.Add(-time.Hour + 100*ms)}}, HeldRetryAfter},
		{"held, token mode", tokenP, held, slots{}, HeldRetryAfter},
		{"held, a queue due past the floor", leakyP, held, slots{scheduled: []time.Time{t0.Add(-time.Hour + 2*time.Minute), t0.Add(-time.Hour + 2*time.Minute + 100*ms), t0.Add(-time.Hour + 2*time.Minute + 200*ms)}}, 2 * time.Minute},
		{"a timed pause", leakyP, leaky.Pause{Until: t0.Add(3 * time.Second), Shift: 3 * time.Second}, slots{scheduled: []time.Time{t0, t0.Add(100 * ms)}}, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record{Pause: tc.pause, TAT: tc.pause.TenantTime(t0).Add(200 * ms)}
			d := Admit(&rec, &tc.q, Call{Now: t0, Arrival: tc.pause.TenantTime(t0), Policy: tc.p})
			if d.Verdict != Refused || d.RetryAfter != tc.want {
				t.Fatalf("%+v, want refused with Retry-After %v", d, tc.want)
			}
		})
	}
}

// A window a reload drops keeps its sends while they count: the policy
// that brings it back places the next job after them, as Redis (a list per
// window) does. Once they count no more, an admission forgets it.
func TestDroppedWindowKeepsItsSends(t *testing.T) {
	hourly := mustWindow(t, "2/1h")
	with := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{hourly}}
	without := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	var rec Record
	var q slots
	for range 2 {
		d := Admit(&rec, &q, Call{Now: t0, Arrival: t0, Policy: with})
		q.scheduled = append(q.scheduled, d.Slot)
	}
	q.scheduled = nil // both sent
	at := t0.Add(time.Second)
	if d := Admit(&rec, &q, Call{Now: at, Arrival: at, Policy: without}); d.Verdict != Admitted || !d.Prompt {
		t.Fatalf("without the window: %+v, want it sent at once", d)
	}
	at = at.Add(time.Second)
	d := Admit(&rec, &q, Call{Now: at, Arrival: at, Policy: with})
	if want := t0.Add(time.Hour); d.Verdict != Admitted || !d.Slot.Equal(want) {
		t.Fatalf("the window back: slot %v (%v), want T0+1h: its two sends still count", d.Slot.Sub(t0), d.Verdict)
	}
	q.scheduled = nil
	later := t0.Add(3 * time.Hour)
	Admit(&rec, &q, Call{Now: later, Arrival: later, Policy: without})
	if _, kept := rec.Windows[hourly.String()]; kept {
		t.Fatalf("windows after the hour: %v, want the spent one forgotten", rec.Windows)
	}
}

func mustWindow(t testing.TB, s string) leaky.Window {
	t.Helper()
	w, err := leaky.ParseWindow(s)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// LimitOf names what binds the wait ExpectedDelay gives: a pause, the
// downstream's ceiling, a full window, or the rate.
func TestLimitOfNamesWhatBinds(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10}
	windowed := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 2, Length: time.Minute}}}
	var full Record
	q := &slots{}
	for range 2 { // the window's 2 places taken
		d := Admit(&full, q, Call{Now: t0, Arrival: t0, Policy: windowed})
		q.deciding = append(q.deciding, d.Slot)
	}
	slow := &leaky.Policy{Interval: time.Second, Burst: 1}
	for _, c := range []struct {
		name    string
		rec     Record
		p       leaky.Policy
		ceiling *leaky.Policy
		depth   int
		want    string
	}{
		{"quiet", Record{}, p, nil, 0, LimitRate},
		{"a backlog at its rate", Record{TAT: t0.Add(time.Second)}, p, nil, 10, LimitRate},
		{"a full window", full, windowed, nil, 2, LimitWindow},
		{"a slower ceiling ahead", Record{TAT: t0.Add(300 * ms)}, p, slow, 3, LimitCeiling},
		{"a ceiling with nobody ahead", Record{}, p, slow, 0, LimitRate},
		{"paused", Record{Pause: leaky.Pause{Until: t0.Add(time.Minute)}}, p, nil, 0, LimitPaused},
		{"held", Record{Pause: leaky.Pause{Held: t0}}, p, slow, 3, LimitPaused},
	} {
		if got := LimitOf(c.rec, t0, c.p, c.ceiling, c.depth); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
