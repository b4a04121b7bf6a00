package rules

import (
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A claim at t0, 20 ms ahead, of one job: dropped if it is not waiting;
// claimed within the horizon at its slot under the pause; not yet beyond
// it; expired once its deadline has come and it would go after it, or has
// passed; waiting until its deadline if a pause moved it past; for a held
// tenant, looked at again at the next whole recheck plus its place past
// the frozen time, or just past its deadline.
func TestClaim(t *testing.T) {
	c := ClaimCall{Now: t0, Horizon: 20 * ms, Recheck: time.Second, Policy: leaky.Policy{Interval: 100 * ms, Burst: 2}, Margin: 5 * ms}
	queued := func(slot time.Duration) queue.Job {
		return queue.Job{ID: "j", State: queue.StateQueued, Slot: t0.Add(slot)}
	}
	withDeadline := func(j queue.Job, d time.Duration) queue.Job { j.Deadline = t0.Add(d); return j }
	retry := queued(-50 * ms)
	retry.State, retry.Attempts = queue.StateRetrying, 2
	sending := queued(0)
	sending.State = queue.StateDispatching
	paused := leaky.Pause{Until: t0.Add(500 * ms), Shift: 500 * ms}
	held := leaky.Pause{Held: t0.Add(-2 * time.Second)}
	for _, tc := range []struct {
		name     string
		pause    leaky.Pause
		job      queue.Job
		verdict  ClaimVerdict
		wait     time.Duration
		at       time.Duration // dispatch time from t0 (claimed, not yet)
		attempts int
	}{
		{"being sent already", leaky.Pause{}, sending, ClaimDrop, 0, 0, 0},
		{"within the horizon", leaky.Pause{}, queued(10 * ms), Claimed, 0, 10 * ms, 1},
		{"a retry overdue", leaky.Pause{}, retry, Claimed, 0, -50 * ms, 3},
		{"beyond the horizon", leaky.Pause{}, queued(100 * ms), ClaimNotYet, 80 * ms, 100 * ms, 0},
		{"paused past its deadline", paused, withDeadline(queued(0), 200*ms), ClaimNotYet, 200 * ms, 500 * ms, 0},
		{"paused past its deadline, which came", paused, withDeadline(queued(0), 0), ClaimExpired, 0, 0, 0},
		{"its deadline passed while paced", leaky.Pause{}, withDeadline(queued(-100*ms), -ms), ClaimExpired, 0, 0, 0},
		{"on time for its deadline", leaky.Pause{}, withDeadline(queued(10*ms), 10*ms), Claimed, 0, 10 * ms, 1},
		{"held", held, queued(300 * ms), ClaimHeld, time.Second + 2300*ms, 0, 0},
		{"held, its deadline sooner", held, withDeadline(queued(300*ms), 400*ms), ClaimHeld, 400*ms + time.Microsecond, 0, 0},
		{"held at its deadline", held, withDeadline(queued(300*ms), 0), ClaimHeld, time.Microsecond, 0, 0},
		{"held past its deadline", held, withDeadline(queued(300*ms), -time.Microsecond), ClaimExpired, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record{Pause: tc.pause}
			var h Handover
			d := Claim(&rec, &h, tc.job, c)
			want := ClaimDecision{Verdict: tc.verdict, Wait: tc.wait, Attempts: tc.attempts}
			if tc.verdict == Claimed || tc.verdict == ClaimNotYet {
				want.DispatchAt = t0.Add(tc.at)
			}
			if d != want {
				t.Fatalf("got %+v, want %+v", d, want)
			}
			if (tc.verdict == ClaimExpired) != (rec.Expired == 1) || (tc.verdict == Claimed) != !h.Next.IsZero() {
				t.Fatalf("record %+v, handover %+v after %+v", rec, h, d)
			}
		})
	}
}

// Each claim moves the tenant's next past it, by its cost in intervals and
// the margin; the last claim is the one that goes last, whichever came
// last; a takeover gives no burst credit until next plus the tolerance. An
// expired job counts, and its booking goes.
func TestClaimKeepsTheHandover(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 2}
	c := ClaimCall{Now: t0, Horizon: 20 * ms, Recheck: time.Second, Policy: p, Margin: 5 * ms}
	rec := Record{Booked: []Booking{{Slot: t0.Add(-100 * ms).UnixNano(), Job: "late"}}}
	var h Handover
	Claim(&rec, &h, queue.Job{ID: "a", State: queue.StateQueued, Slot: t0.Add(10 * ms), Cost: 2}, c)
	Claim(&rec, &h, queue.Job{ID: "b", State: queue.StateQueued, Slot: t0.Add(-50 * ms)}, c)
	want := Handover{Next: t0.Add(215 * ms), Last: t0.Add(10 * ms), LastCost: 2, NoCredit: t0.Add(315 * ms)}
	if h != want {
		t.Fatalf("handover %+v, want %+v", h, want)
	}
	d := Claim(&rec, &h, queue.Job{ID: "late", State: queue.StateRetrying, Slot: t0.Add(-100 * ms), Deadline: t0.Add(-ms)}, c)
	if d.Verdict != ClaimExpired || rec.Expired != 1 || len(rec.Booked) != 0 || h != want {
		t.Fatalf("expired: %+v, record %+v, handover %+v", d, rec, h)
	}
}

// An attempt that ended its job counts in its tenant's counters and moves
// its next past the write (never back); one that wrote nothing leaves it.
func TestFinish(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1}
	j := queue.Job{ID: "a", State: queue.StateDispatching, Attempts: 1, Slot: t0, DispatchAt: t0, Cost: 2, LastError: "503"}
	for _, tc := range []struct {
		name    string
		o       queue.Outcome
		state   queue.JobState
		next    time.Duration
		lastErr string
	}{
		{"delivered late", queue.Outcome{Result: queue.Succeeded, SentAt: t0.Add(30 * ms), Status: 200}, queue.StateSucceeded, 235 * ms, ""},
		{"delivered early", queue.Outcome{Result: queue.Succeeded, SentAt: t0.Add(-200 * ms), Status: 200}, queue.StateSucceeded, 50 * ms, ""},
		{"failed unsent", queue.Outcome{Result: queue.Failed}, queue.StateFailed, 50 * ms, "503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			h := Handover{Next: t0.Add(50 * ms)}
			cur, paused := Finish(&rec, &h, j, tc.o, t0.Add(time.Second), p, 5*ms)
			if cur.State != tc.state || paused || !cur.FinishedAt.Equal(t0.Add(time.Second)) || cur.LastError != tc.lastErr {
				t.Fatalf("job %+v, paused %v", cur, paused)
			}
			if rec.Delivered+rec.Failed != 1 || !h.Next.Equal(t0.Add(tc.next)) {
				t.Fatalf("record %+v, next t0%+v, want t0%+v", rec, h.Next.Sub(t0), tc.next)
			}
		})
	}
}

// A tenant's record is kept while it has jobs or a hold; then until its
// schedule runs out in real time, plus the idle time.
func TestKeepRecord(t *testing.T) {
	const idle = time.Minute
	paused := leaky.Pause{Until: t0.Add(time.Second), Shift: 100 * ms}
	for _, tc := range []struct {
		name    string
		rec     Record
		jobs    int
		ttl     time.Duration
		forever bool
	}{
		{"jobs", Record{}, 1, 0, true},
		{"held", Record{Pause: leaky.Pause{Held: t0}}, 0, 0, true},
		{"its schedule ahead", Record{TAT: t0.Add(300 * ms)}, 0, 300*ms + idle, false},
		{"paused", Record{TAT: t0.Add(300 * ms), Pause: paused}, 0, time.Second + idle, false},
		{"run out", Record{TAT: t0.Add(-time.Hour)}, 0, idle, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ttl, forever := KeepRecord(tc.rec, tc.jobs, t0, idle); ttl != tc.ttl || forever != tc.forever {
				t.Fatalf("kept %v (forever %v), want %v (%v)", ttl, forever, tc.ttl, tc.forever)
			}
		})
	}
}

// An outcome moves its send in the windows from its slot to its write, if
// later, and only its own: the window of 2 per second then leaves room
// for the next send a second after the write, not after the slot. A write
// on time, or none, leaves the windows as they were; so does a window that
// no longer holds the slot.
func TestOutcomeCountsTheWriteInTheWindows(t *testing.T) {
	p := leaky.Policy{Interval: 100 * ms, Burst: 1, Capacity: 5, Windows: []leaky.Window{{N: 2, Length: time.Second}}}
	j := queue.Job{ID: "a", Tenant: "acme", State: queue.StateDispatching, Attempts: 1, Slot: t0, DispatchAt: t0}
	for _, tc := range []struct {
		name   string
		sentAt time.Time
		want   []time.Duration // the window's entries, from t0
	}{
		{"written late", t0.Add(40 * ms), []time.Duration{40 * ms, 100 * ms}},
		{"written after the next slot", t0.Add(150 * ms), []time.Duration{100 * ms, 150 * ms}},
		{"written on time", t0, []time.Duration{0, 100 * ms}},
		{"not written", time.Time{}, []time.Duration{0, 100 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			rec.CountSend(p, t0, 1)
			rec.CountSend(p, t0.Add(100*ms), 1) // the next job's
			ApplyOutcome(&rec, j, queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: tc.sentAt}, t0.Add(time.Second), p)
			var got []time.Duration
			for _, at := range rec.Recent(p)[0] {
				got = append(got, at.Sub(t0))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("window %v, want %v", got, tc.want)
			}
			if late := LateInWindows(p, j, tc.sentAt); late != tc.sentAt.After(t0) {
				t.Errorf("LateInWindows = %v", late)
			}
		})
	}
	// A slot the window no longer holds moves nothing.
	var rec Record
	rec.CountSend(p, t0.Add(100*ms), 1)
	rec.CountSend(p, t0.Add(200*ms), 1)
	rec.CountWrite(p, t0, t0.Add(300*ms), 1)
	if got := rec.Recent(p)[0]; !got[0].Equal(t0.Add(100*ms)) || !got[1].Equal(t0.Add(200*ms)) {
		t.Fatalf("window %v after a write of a slot it does not hold", got)
	}
}
