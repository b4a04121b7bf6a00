package queuetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"throttler/internal/queue"
	"throttler/internal/testutil"
)

// The model test: a store driven through long random sequences of
// operations on a fake clock, checked after every step against a small
// reference model of DESIGN.md sections 2-4 (model_ref.go). A backend runs
// it from its own tests:
//
//	func TestModel(t *testing.T) {
//		queuetest.RunModel(t, driver, 16, 150)
//	}
//
// It checks, after every step: the queue bound and the depth and in-flight
// counts Tenant reports; expected_delay (Admission.ExpectedDelay and
// Tenant) and a refusal's Retry-After; that every write comes exactly when
// its job is due, the rate (GCRA on the writes: at most W/T + burst in any
// window W) and every configured window (N per length) on every attempt
// written; that no admitted job is lost (each ends delivered, failed,
// cancelled or expired, or is still waiting); that no job is written twice
// unless a crash came between the write and its recorded outcome (then the
// repeat is the same job, so the same Idempotency-Key); and that the first
// attempt comes when the admission said (invariant 5) unless a pause or a
// crash came between.
//
// A failing seed is shrunk to the shortest sequence of operations that
// still fails the same check, printed as Go code for a regression test
// (ReplayModel).

// ModelDriver is a backend under the model test.
type ModelDriver struct {
	// Open opens a store on fresh data.
	Open func(t testing.TB, c Config) (queue.Store, error)
	// Crash takes what a kill -9 of the process running s would leave of
	// its data at this moment, and returns how to start a new process on
	// it. After Crash returns, nothing s does may reach the new store's
	// data (the test stops s's Consume and closes s next); restart runs
	// after any downtime the test chooses, with the clock already moved.
	Crash func(t testing.TB, s queue.Store) (restart func(t testing.TB, c Config) (queue.Store, error), err error)
	// TakeStartLag, if set, reports the store's estimate of how long a
	// prompt send takes to start (it schedules as if every job arrived
	// that much later) and resets it to zero. On the fake clock sends start
	// at once, so anything but zero is the estimate measuring something
	// else (issue 12 #1); it is reset so that the model can go on.
	TakeStartLag func(s queue.Store) time.Duration
	// Quiet, if set, reports whether the store's own background work is
	// idle: every wake-up it was given has been taken and it waits for the
	// clock again. The test moves the fake clock only when it is, so that
	// the store never computes a wait from a time that has passed. Without
	// it the test only watches for new waits on the clock, which a busy
	// machine can outrun.
	Quiet func(s queue.Store) bool
	// Known are the defects the store is known to have: the checks they
	// break are relaxed as Defect says, so that the rest still runs.
	Known Defect
}

// Defect is a known defect of a store (issue 12) that the model can
// tolerate, as a set of flags.
type Defect uint

const (
	// DefectStartLag (issue 12 #1): the start-lag estimate picks up waits
	// that are not the start of a send (a resend after a crash, a Retry of
	// an old failed job). Tolerated: a nonzero TakeStartLag is not a
	// failure.
	DefectStartLag Defect = 1 << iota
	// DefectCountRetryAfter (issue 12 #4, the part left): a refusal by
	// the count bound without windows (jobs waiting to retry, a pause) says
	// Retry-After of one interval instead of the time until the job would
	// be admitted. Tolerated: such a Retry-After is not checked.
	DefectCountRetryAfter
	// DefectRestartCost (found by the model): a restart spaces the next
	// send one interval after the last possible one, whatever that job's
	// cost (the schedule gives a cost-c job c intervals). Tolerated: after
	// a restart the weighted spacing starts from one interval.
	DefectRestartCost
	// DefectRepeatCost (found by the model): a repeat of an admitted
	// idempotency key whose cost the policy no longer allows (a reload
	// lowered it) is answered 422 cost_too_large instead of the first
	// answer, although the job was admitted and will be sent. Tolerated:
	// that answer is accepted.
	DefectRepeatCost
	// DefectBatchWindow (found by the model, in the fix of #4): with
	// windows, the count of jobs that wait leaves out the jobs admitted
	// earlier in the same Enqueue call (they join the schedule only after
	// the commit), so one batch admits any number. Tolerated: the model
	// counts as the store does.
	DefectBatchWindow
	// DefectWindowRetryAfter (issue 12 #4, the part left): in token mode
	// with windows, a job the rate refuses is told the rate's Retry-After
	// even when a full window refuses it for longer. Tolerated: that
	// Retry-After is not checked.
	DefectWindowRetryAfter
	// DefectPushbackWindow (found by the model): a job answered 429 is
	// sent again when the pause ends whatever its windows hold (each
	// resend counts at the same slot in tenant time, so the bookkeeping
	// never holds it back): only the dispatcher's gate keeps the window.
	// Tolerated: such a resend is counted, not checked.
	DefectPushbackWindow
)

// ModelFailure is what a model run found.
type ModelFailure struct {
	Step int // index of the op (len(ops): the final drain)
	Op   Op
	At   time.Duration // fake time since T0
	// Kind is the check that failed; a shrink keeps it.
	Kind string
	Msg  string
}

func (f *ModelFailure) Error() string {
	return fmt.Sprintf("step %d (%v) at T0+%v: %s: %s", f.Step, f.Op, f.At, f.Kind, f.Msg)
}

// RunModel runs seeds random sequences of steps operations each (seeds 1
// to seeds), several at once. THROTTLER_MODEL_SEEDS and
// THROTTLER_MODEL_STEPS override the numbers (a soak);
// THROTTLER_MODEL_SEED=N runs seed N alone. A failing seed is shrunk and
// printed.
func RunModel(t *testing.T, d ModelDriver, seeds, steps int) {
	seeds = envInt("THROTTLER_MODEL_SEEDS", seeds)
	steps = envInt("THROTTLER_MODEL_STEPS", steps)
	first := 1
	if one := envInt("THROTTLER_MODEL_SEED", 0); one > 0 {
		first, seeds = one, 1
	}
	// Runs spend most of their time waiting (group commits, settling), so
	// more of them go at once than there are cores.
	workers := 6
	if testutil.Race {
		workers = 3
	}
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	seedCh := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range seedCh {
				ops := GenerateOps(uint64(seed), steps)
				f := runModelOps(t, d, ops)
				if f == nil {
					continue
				}
				mu.Lock()
				failed++
				n := failed
				mu.Unlock()
				if n > 3 {
					t.Errorf("seed %d: %v (not shrunk: enough failures already)", seed, f)
					continue
				}
				short, sf := ShrinkModel(t, d, ops, f, 90*time.Second)
				t.Errorf("seed %d: %v\nshortest failing sequence (%d of %d ops): %v\nreplay it with:\n\tqueuetest.ReplayModel(t, driver, %s)", seed, f, len(short), len(ops), sf, FormatOps(short))
			}
		}()
	}
	for seed := first; seed < first+seeds; seed++ {
		seedCh <- seed
	}
	close(seedCh)
	wg.Wait()
	t.Logf("model: %d seeds x %d steps in %v", seeds, steps, time.Since(start).Round(time.Millisecond))
}

// ReplayModel runs ops once and fails t with what the model found.
func ReplayModel(t *testing.T, d ModelDriver, ops []Op) {
	t.Helper()
	if f := runModelOps(t, d, ops); f != nil {
		t.Fatalf("%v", f)
	}
}

// ShrinkModel looks for a shorter sequence than ops that still fails the
// check f failed (dropping chunks of steps, then single steps and jobs of
// batches, then shortening advances), within budget.
func ShrinkModel(t *testing.T, d ModelDriver, ops []Op, f *ModelFailure, budget time.Duration) ([]Op, *ModelFailure) {
	deadline := time.Now().Add(budget)
	cur, best := trimTo(ops, f), f
	try := func(c []Op) bool {
		if time.Now().After(deadline) || len(c) == 0 {
			return false
		}
		if g := runModelOps(t, d, c); g != nil && g.Kind == f.Kind {
			cur, best = trimTo(c, g), g
			return true
		}
		return false
	}
	// ddmin over steps
	for n := 2; len(cur) >= 2 && time.Now().Before(deadline); {
		size := (len(cur) + n - 1) / n
		removed := false
		for i := 0; i < len(cur); i += size {
			c := append(append([]Op(nil), cur[:i]...), cur[min(i+size, len(cur)):]...)
			if try(c) {
				removed = true
				n = max(n-1, 2)
				break
			}
		}
		if !removed {
			if size == 1 {
				break
			}
			n = min(2*n, len(cur))
		}
	}
	// fewer jobs in batches, shorter advances and downtimes
	for changed := true; changed && time.Now().Before(deadline); {
		changed = false
		for i := 0; i < len(cur); i++ {
			op := cur[i]
			if op.Kind == OpEnqueue && len(op.Jobs) > 1 {
				for k := range op.Jobs {
					c := append([]Op(nil), cur...)
					c[i].Jobs = append(append([]JobSpec(nil), op.Jobs[:k]...), op.Jobs[k+1:]...)
					if try(c) {
						changed = true
						break
					}
				}
			}
			if i < len(cur) && (cur[i].Kind == OpAdvance || cur[i].Kind == OpCrash) && cur[i].D > modelGrid {
				c := append([]Op(nil), cur...)
				c[i].D = (cur[i].D/2/modelGrid + 0) * modelGrid
				if c[i].Kind == OpAdvance && c[i].D == 0 {
					c[i].D = modelGrid
				}
				if try(c) {
					changed = true
				}
			}
		}
	}
	return cur, best
}

// trimTo drops what follows the failing step.
func trimTo(ops []Op, f *ModelFailure) []Op {
	if f.Step+1 < len(ops) {
		return ops[:f.Step+1]
	}
	return ops
}

func envInt(name string, def int) int {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return def
}
