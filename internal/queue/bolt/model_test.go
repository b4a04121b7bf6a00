package bolt

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The model test on the embedded store (see queuetest/model.go). CI runs a
// fixed set of seeds; a soak is
//
//	THROTTLER_MODEL_SEEDS=500 go test -run 'TestModel$' ./internal/queue/bolt/
//
// (THROTTLER_MODEL_STEPS sets the steps per seed, THROTTLER_MODEL_SEED=N
// runs seed N alone).

// modelKnown are the known defects this store still has: the model
// tolerates them here so that the rest is checked, and the regression
// cases below pin each one (skipped until it is fixed; then drop its flag).
const modelKnown = queuetest.DefectPushbackWindow |
	queuetest.DefectWindowFuture

// modelDriver runs the model on the embedded store; known are the defects
// it tolerates.
func modelDriver(known queuetest.Defect) queuetest.ModelDriver {
	var files atomic.Int64
	return queuetest.ModelDriver{
		Open: func(t testing.TB, c queuetest.Config) (queue.Store, error) {
			return openModelStore(filepath.Join(t.TempDir(), "model.db"), c)
		},
		// kill -9 leaves the file as of its last commit and the write-ahead
		// log as of its last fdatasync: a copy of both between two writes
		// of the committer is exactly that. The old process goes on writing
		// to its own files, which nobody reads.
		Crash: func(t testing.TB, s queue.Store) (func(testing.TB, queuetest.Config) (queue.Store, error), error) {
			path := filepath.Join(t.TempDir(), fmt.Sprintf("crashed-%d.db", files.Add(1)))
			if err := s.(*Store).snapshot(path); err != nil {
				return nil, err
			}
			return func(t testing.TB, c queuetest.Config) (queue.Store, error) { return openModelStore(path, c) }, nil
		},
		SentBy: func(s queue.Store, now time.Time) (by time.Time) {
			s.(*Store).db.View(func(tx *bbolt.Tx) error { by = sentBy(tx, now); return nil })
			return by
		},
		TakeStartLag: func(s queue.Store) time.Duration {
			return s.(*Store).lag.take()
		},
		// The dispatcher is in its select: no poke waiting, and it has
		// planned its next wake (it clears the plan when it wakes).
		Quiet: func(s queue.Store) bool {
			st := s.(*Store)
			return len(st.wake) == 0 && st.nextWake.Load() != math.MaxInt64
		},
		TAT: func(s queue.Store, tenant string) (time.Time, error) {
			st := s.(*Store)
			st.mu.Lock()
			defer st.mu.Unlock()
			tm, err := st.loadTenant(tenant)
			if err != nil {
				return time.Time{}, err
			}
			return tm.rec.TAT, nil
		},
		Windows: func(s queue.Store, tenant string, w leaky.Window) ([]time.Time, error) {
			st := s.(*Store)
			st.mu.Lock()
			defer st.mu.Unlock()
			tm, err := st.loadTenant(tenant)
			if err != nil {
				return nil, err
			}
			return tm.rec.Recent(leaky.Policy{Windows: []leaky.Window{w}})[0], nil
		},
		Known: known,
	}
}

func openModelStore(path string, c queuetest.Config) (queue.Store, error) {
	return Open(path, Options{Clock: c.Clock, Policy: c.Policy, Caps: c.Caps, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// TestModel: CI size; a soak with THROTTLER_MODEL_SEEDS; two short seeds
// under -short (the edit loop).
func TestModel(t *testing.T) {
	seeds, steps := 32, 200
	if testutil.Race {
		// The same steps, fewer seeds: the race detector watches the
		// store's goroutines on each step; the plain pass runs them all.
		seeds, steps = 6, 150
	}
	if testing.Short() {
		seeds, steps = 2, 50
	}
	queuetest.RunModel(t, modelDriver(modelKnown), seeds, steps)
}

// The cases the model found, shrunk. Each runs with the tolerances of
// TestModel but its own: a defect still open is skipped (its fix removes
// the skip and the flag from modelKnown); the rest pass.
func TestModelRegression(t *testing.T) {
	ms := time.Millisecond
	windows := queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2, Windows: []queuetest.WindowSpec{{N: 2, Length: 500 * ms}}}
	tokenWindow := queuetest.PolicySpec{Interval: 50 * ms, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}
	cases := []struct {
		name   string
		defect queuetest.Defect // the tolerance this case must run without
		skip   string           // "": it passes
		ops    []queuetest.Op
	}{
		{
			// A job written with no outcome before a crash counts in its
			// windows at the restart (the lease on sending had not ended):
			// after it, a token-mode job is refused until the window
			// holds room, and the model, counting the same, agrees.
			name: "UnrecordedWindowAfterCrash",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k2"}}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 50 * time.Millisecond, Timeout: 100 * time.Millisecond}},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 420 * time.Millisecond}}},
				{Kind: queuetest.OpCrash, D: 200 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 250 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 250 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 470 * time.Millisecond}}},
			},
		},
		{
			// Windows add no place to the queue (capacity 5: one
			// at once and five waiting, then a seventh is refused until the
			// first waiting one goes, exactly).
			name: "WindowPlace",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 5, Windows: []queuetest.WindowSpec{{N: 100, Length: time.Minute}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// A prompt job is not scheduled later and later as
			// jobs are sent (the start lag stays at the real overhead: none).
			name: "PromptStartLag", defect: queuetest.DefectStartLag,
			ops: promptStream(40),
		},
		{
			// Killed again and again, with a backlog and writes
			// in flight, each restart spaces from the last possible write.
			name: "RepeatedCrashes",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 40}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 40}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: make([]queuetest.JobSpec, 40)},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: make([]queuetest.JobSpec, 40)},
				{Kind: queuetest.OpAdvance, D: 250 * ms},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 400 * ms},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 650 * ms},
				{Kind: queuetest.OpCrash, D: 100 * ms},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Timeout: 100 * ms, Backoff: 50 * ms}},
				{Kind: queuetest.OpAdvance, D: 500 * ms},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
			},
		},
		{
			// Found on Redis (seed 260 of a soak of seeds 201-500); the same
			// here (queuetest.CaseBookedRetriesAndTheRate).
			name: "BookedRetriesAndTheRate",
			ops:  queuetest.CaseBookedRetriesAndTheRate,
		},
		{
			// Found by the model: a held tenant's write lost in a crash was sent
			// again the instant it was resumed.
			name: "HeldRestart", defect: queuetest.DefectHeldRestart,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 150 * ms, Timeout: 150 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpResume, Tenant: "b"},
			},
		},
		{
			// Found by the model: one Enqueue call admitted past capacity with
			// windows (the jobs it admitted earlier were not counted as waiting).
			name: "BatchWindow", defect: queuetest.DefectBatchWindow,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: windows},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {}, {}, {}}},
			},
		},
		{
			// Found by the model: a restart spaced the resend of a cost-4 job one
			// interval after its possible write, not four.
			name: "RestartCost", defect: queuetest.DefectRestartCost,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 50 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 4}}},
				{Kind: queuetest.OpCrashOnWrite},
			},
		},
		{
			// Found with the fix of RestartCost: the resend of a cost-4 job
			// possibly written just before the crash, behind a retry that
			// waited for its backoff.
			name: "RestartCostBehindRetry",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 300 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 4}}},
				{Kind: queuetest.OpCrash},
			},
		},
		{
			// Found while the fix (cd9a7d6) was being made: a restart gave the
			// re-spaced job and the ones after it the burst again.
			name: "RestartBurst",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 50 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
			},
		},
		{
			// Found by a soak (seed 207 of 200-349), on the build before the
			// schedule's lines too: after pushbacks, a cap dropped by a
			// reload and a crash, a job of a tenant whose count is full
			// (capacity 0, burst 2, 2 waiting) is admitted.
			name: "CountFullAfterPushbacksAndACrash",
			skip: "open: admitted with the count full (depth 3 where the model refuses at 2), see the closing note",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 4, MaxInFlight: 1}},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 2}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpRetry, Pick: 981},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpAdvance, D: 800 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 270 * ms}}},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpCancel, Pick: 924},
				{Kind: queuetest.OpCrashOnWrite},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 120 * ms}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 2, Key: "k5"}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 1300 * ms}}},
				{Kind: queuetest.OpCancel, Pick: 324},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 0}},
				{Kind: queuetest.OpCancel, Pick: 823},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{NotBefore: 250 * ms}, {}, {}, {}}},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Found by the model: a restart placed retries around a booking,
			// out of their order, and the schedule, given each tenant's jobs
			// in one piece, took them as in order: a due retry was never
			// handed out.
			name: "RestartOrderAroundABooking",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 2, Capacity: 0, Windows: []queuetest.WindowSpec{{N: 3, Length: time.Second}}}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 150 * ms, Burst: 1, Capacity: 4}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpAdvance, D: time.Second},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 150 * ms, Timeout: 150 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 4, Key: "k4"}}},
				{Kind: queuetest.OpRetry, Pick: 609},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCancel, Pick: 931},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Cost: 4, Key: "k4", NotBefore: 800 * ms}, {}, {Deadline: 70 * ms}, {Cost: 4, Key: "k4", Deadline: 570 * ms}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 150 * ms},
				{Kind: queuetest.OpCrashOnWrite},
			},
		},
		{
			// Found by the model: a repeat of an admitted key was answered 422
			// cost_too_large after a reload lowered the bucket.
			name: "RepeatCost", defect: queuetest.DefectRepeatCost,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 3, Key: "k1"}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 3, Key: "k1"}}},
			},
		},
		{
			// Found by the model: a job admitted to a held tenant with a deadline
			// was expired only at the dispatcher's next poll.
			name: "HeldDeadline", defect: queuetest.DefectLateExpiry,
			ops: []queuetest.Op{
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Deadline: 320 * ms}}},
				{Kind: queuetest.OpAdvance, D: 350 * ms},
			},
		},
		{
			name: "PushbackWindow", defect: queuetest.DefectPushbackWindow,
			skip: "defect: a resend after 429 ignores the windows (3 sends within 200ms under 2/500ms), see report",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpReload, Tenant: "b", Policy: windows},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {}}},
			},
		},
		{
			name: "TokenWindowRetryAfter", defect: queuetest.DefectWindowRetryAfter,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: tokenWindow},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			name: "RetryPacing", defect: queuetest.DefectRetryPacing,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 250 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 50 * ms},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			name: "RetryPacingCancel", defect: queuetest.DefectRetryPacing,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 100 * ms, Timeout: 50 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCancel, Pick: 864},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k3"}}},
			},
		},
		{
			// Found by the model: Retry of a job whose cost a reload made too
			// large answered 429 (for ever) instead of 422 cost_too_large.
			name: "RetryCost", defect: queuetest.DefectRetryCost,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 2}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPermanent}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 3}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 1}},
				{Kind: queuetest.OpRetry, Pick: 0},
			},
		},
		{
			name: "PushbackBurst", defect: queuetest.DefectPushbackBurst,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "b", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {}}},
			},
		},
		{
			name: "WindowFuture", defect: queuetest.DefectWindowFuture,
			skip: "defect: a retry placed later in a window makes a token-mode job that fits now be refused, see report",
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 250 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 2}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: tokenWindow},
				{Kind: queuetest.OpAdvance, D: 550 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k1"}}},
			},
		},
		{
			// Found by the soak of the build that put caps and scheduled
			// sends in the model (seed 43 of 100): a cost-4 retry placed
			// in the burst right after the booked job it absorbed, both
			// at 1.25 s. Cheaper first, the pair keeps the costs' spacing;
			// the model checked the writes of one moment in admission
			// order (the retry first), which a downstream need not.
			name: "CapRetryAndBookingCostSpacing",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * ms, Burst: 1, Capacity: 4, MaxInFlight: 1}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Cost: 4, Key: "k4"}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 2, Capacity: 2, MaxInFlight: 2}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 350 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k2", NotBefore: 1250 * ms}}},
				{Kind: queuetest.OpAdvance, D: 450 * ms},
			},
		},
		{
			name: "StartLagAfterCrash", defect: queuetest.DefectStartLag,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerTimeout, Backoff: 50 * ms, Timeout: 100 * ms}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpCrash},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpAdvance, D: 200 * ms},
			},
		},
		{
			name: "StartLagAfterRetry", defect: queuetest.DefectStartLag,
			ops: []queuetest.Op{
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPermanent}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: time.Second},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerOK}},
				{Kind: queuetest.OpRetry, Pick: 0},
			},
		},
		{
			name: "CountRetryAfter", defect: queuetest.DefectCountRetryAfter,
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * ms, Burst: 1, Capacity: 1}},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 2 * time.Second}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 100 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpAdvance, D: 300 * ms},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
			},
		},
		{
			// Seed 253 of a 500-seed soak, shrunk (34 ops): a tenant
			// reloaded back to a window while jobs admitted under it
			// wait was promised 600 ms, the model's 1.1 s, as the store
			// had forgotten the window's sends when a write under the
			// policy between dropped it. The build before the rulebook
			// (f45cf31) did the same. Both stores now keep a dropped
			// window's sends while they count.
			name: "ReloadedWindowPromise",
			ops: []queuetest.Op{
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
				{Kind: queuetest.OpHold, Tenant: "b"},
				{Kind: queuetest.OpAdvance, D: 150 * time.Millisecond},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k3"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Key: "k2"}}},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpHold, Tenant: "a"},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 150 * time.Millisecond}},
				{Kind: queuetest.OpCancel, Pick: 211},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{Key: "k5"}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpRetry, Pick: 343},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}, {Cost: 2}}},
				{Kind: queuetest.OpResume, Tenant: "b"},
				{Kind: queuetest.OpAdvance, D: 250 * time.Millisecond},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerRetry, Backoff: 200 * time.Millisecond}},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 250 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 50 * time.Millisecond},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 2, Windows: []queuetest.WindowSpec{{N: 2, Length: 500 * time.Millisecond}}}},
				{Kind: queuetest.OpEnqueue, Tenant: "b", Jobs: []queuetest.JobSpec{{}, {}}},
				{Kind: queuetest.OpAdvance, D: 100 * time.Millisecond},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpDownstream, Answer: queuetest.Answer{Kind: queuetest.AnswerPushback, N: 2}},
				{Kind: queuetest.OpResume, Tenant: "a"},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpRetry, Pick: 549},
				{Kind: queuetest.OpAdvance, D: 300 * time.Millisecond},
				{Kind: queuetest.OpCancel, Pick: 817},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{Deadline: 520 * time.Millisecond}}},
				{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}},
				{Kind: queuetest.OpReload, Tenant: "a", Policy: queuetest.PolicySpec{Interval: 50 * time.Millisecond, Burst: 1, Capacity: 3, Windows: []queuetest.WindowSpec{{N: 3, Length: 1 * time.Second}}}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.skip != "" && os.Getenv("THROTTLER_MODEL_DEFECTS") == "" {
				t.Skip(c.skip)
			}
			queuetest.ReplayModel(t, modelDriver(modelKnown&^c.defect), c.ops)
		})
	}
}

// promptStream is n jobs of one tenant, each enqueued when the last has
// gone: every one can go at once.
func promptStream(n int) []queuetest.Op {
	var ops []queuetest.Op
	for range n {
		ops = append(ops, queuetest.Op{Kind: queuetest.OpEnqueue, Tenant: "a", Jobs: []queuetest.JobSpec{{}}}, queuetest.Op{Kind: queuetest.OpAdvance, D: 150 * time.Millisecond})
	}
	return ops
}
