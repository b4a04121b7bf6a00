package bolt

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

func newStartLag() *startLag { return &startLag{durable: map[string]time.Time{}} }

// durableAlone runs n calls one at a time, each durable wait after its
// decision, and returns the clock after them.
func durableAlone(l *startLag, at time.Time, n int, wait time.Duration) time.Time {
	for range n {
		_, ahead := l.estimate()
		l.deciding()
		l.durableCall(at, at.Add(wait), ahead, nil)
		at = at.Add(wait)
	}
	return at
}

// A burst of calls is promised the wait of the calls ahead of it before
// any of them is measured: the moving average of the last waits (all
// quiet) would promise each the wait of one call alone, and every
// tenant's first job would go late, its queue behind it. (Measured before
// this: 100 tenants' batches at once, 99% of first jobs handed over after
// their slot; BenchmarkPromptBurst.)
func TestStartLagCountsTheCallsAhead(t *testing.T) {
	l := newStartLag()
	now := durableAlone(l, queuetest.T0, 40, 2*time.Millisecond)
	alone, ahead := l.estimate()
	if ahead != 0 || alone < 2*time.Millisecond || alone > 2300*time.Microsecond {
		t.Fatalf("after 40 calls alone of 2 ms each: estimate %v with %d ahead, want 2 ms and a little margin, none ahead", alone, ahead)
	}
	for range 9 {
		l.deciding() // a burst: 9 calls decided, none durable yet
	}
	burst, ahead := l.estimate()
	if ahead != 9 || burst < 10*alone-time.Microsecond {
		t.Fatalf("with 9 calls being made durable: estimate %v (%d ahead), want the wait of all 10 (each as one alone): at least %v", burst, ahead, 10*alone)
	}
	for range 200 {
		l.deciding() // far more: the cap holds
	}
	if capped, _ := l.estimate(); capped != maxStartLag {
		t.Fatalf("with 209 calls ahead: estimate %v, want the cap %v", capped, maxStartLag)
	}
	for range 209 {
		l.failed()
	}
	// The burst's calls, measured: 10 at once wait 5 ms, each call ahead
	// adding a third of a millisecond. A burst is promised that from now
	// on; a call alone still its 2 ms.
	for range 40 {
		l.deciding()
		l.durableCall(now, now.Add(5*time.Millisecond), 9, nil)
	}
	if quiet, _ := l.estimate(); quiet != alone {
		t.Fatalf("after the burst's calls, a call alone: estimate %v, want %v as before (the burst measures what calls ahead add)", quiet, alone)
	}
	for range 9 {
		l.deciding()
	}
	if again, _ := l.estimate(); again < 5*time.Millisecond || again > 5500*time.Microsecond {
		t.Fatalf("another burst of 10, measured at 5 ms: estimate %v, want about 5 ms", again)
	}
}

// The promise is past the spread of the waits, not at their average: aimed
// at the average, half the prompt jobs would be handed over late.
func TestStartLagPromisesPastTheSpread(t *testing.T) {
	l := newStartLag()
	at := queuetest.T0
	for i := range 80 {
		_, ahead := l.estimate()
		l.deciding()
		wait := time.Millisecond
		if i%2 == 1 {
			wait = 3 * time.Millisecond
		}
		l.durableCall(at, at.Add(wait), ahead, nil)
		at = at.Add(wait)
	}
	if lag, _ := l.estimate(); lag < 3*time.Millisecond {
		t.Fatalf("calls alone waiting 1 ms and 3 ms by turns: estimate %v, want the slower ones covered (3 ms or more)", lag)
	}
}

// The send part measures from the admission being durable to the write,
// not from the decision: the wait for durability is predicted apart, and
// counted twice it would push every prompt job later than it goes.
func TestStartLagMeasuresTheSendFromDurable(t *testing.T) {
	l := newStartLag()
	decided := queuetest.T0
	lag := 25 * time.Millisecond // what the job was promised
	for i := range 40 {
		j := queue.Job{ID: fmt.Sprint("j", i), Tenant: "t", Prompt: true, Attempts: 1, EnqueuedAt: decided, AdmitDelay: lag, DispatchAt: decided.Add(lag)}
		l.deciding()
		l.durableCall(decided, decided.Add(20*time.Millisecond), 0, []queue.Job{j})
		j.SentAt = j.DispatchAt.Add(300 * time.Microsecond) // written 0.3 ms after its slot
		l.observe(j, decided.Add(20*time.Millisecond+500*time.Microsecond))
	}
	// 0.5 ms from durable to the hand-over, 0.3 ms from the slot to the write.
	if got := time.Duration(l.send.avg.Load()); got < 780*time.Microsecond || got > 800*time.Microsecond {
		t.Fatalf("send part %v, want about 0.8 ms (durable to hand-over, and slot to write)", got)
	}
	if len(l.durable) != 0 {
		t.Fatalf("%d durable times kept after their attempts were measured, want none", len(l.durable))
	}
}

// A prompt job whose first attempt never comes (cancelled before its
// send) is forgotten: the times kept are bounded by the calls of the last
// forgetDurableAfter, not by every prompt job ever admitted.
func TestStartLagForgetsJobsNeverSent(t *testing.T) {
	l := newStartLag()
	at := queuetest.T0
	for i := range 1000 {
		l.deciding()
		l.durableCall(at, at, 0, []queue.Job{{ID: fmt.Sprint("j", i), Prompt: true}})
		at = at.Add(10 * time.Millisecond)
	}
	// 10 s of calls, one prompt job each every 10 ms: those of the last
	// forgetDurableAfter are kept.
	if want := int(forgetDurableAfter/(10*time.Millisecond)) + 1; len(l.durable) != want || len(l.order) != want {
		t.Fatalf("kept %d durable times (%d in order), want %d", len(l.durable), len(l.order), want)
	}
}

// A start lag that falls between a tenant's admissions does not make its
// queue look deeper than it is: with capacity 2 (one job sent at once, two
// waiting), the third job is admitted even though the first was decided
// with a lag 50 ms longer than the third's, and only the fourth is
// refused (invariant 3). Decided from each call's own arrival (now plus
// its lag), the backlog behind the first job ran from a later arrival
// than the third's, and the third was refused with one job waiting.
func TestFallingStartLagRejectsOnlyWhenFull(t *testing.T) {
	clk := clock.NewFake(queuetest.T0)
	s, err := Open(filepath.Join(t.TempDir(), "throttler.db"), Options{Clock: clk,
		Policy: func(string) leaky.Policy { return leaky.Policy{Interval: time.Hour, Burst: 1, Capacity: 2} }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.lag.send.avg.Store(int64(50 * time.Millisecond))
	if a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(0)); !a.Admitted() || a.ExpectedDelay < 50*time.Millisecond {
		t.Fatalf("first job: %+v, want admitted with the 50 ms start lag", a)
	}
	s.lag.take() // the estimate falls to nothing
	clk.Advance(time.Millisecond)
	for i := 1; i <= 2; i++ {
		if a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i)); !a.Admitted() {
			t.Fatalf("job %d refused with %d waiting of capacity 2: %+v", i, i-1, a.Rejected)
		}
	}
	if a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(3)); a.Admitted() {
		t.Fatalf("a fourth job admitted with two waiting of capacity 2: %+v", a)
	}
}
