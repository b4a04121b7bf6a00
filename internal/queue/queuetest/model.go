package queuetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The model test: a store driven through long random sequences of
// operations on a fake clock, checked after every step against a small
// reference model of DESIGN.md sections 2-4 (model_ref.go). A backend runs
// it from its own tests:
//
//	func TestModel(t *testing.T) {
//		queuetest.RunModel(t, driver, 32, 200) // seeds, steps
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
//
// The run is deterministic: the clock moves only when the store is quiet
// (no handler running, every outcome recorded, nothing handed over and not
// taken, no new waits begun), and then to the next moment the store, a
// handler or the model waits for; every time the store is asked about lies
// on a 50 ms grid (deadlines 20 ms past one), wider than the hand-over lead,
// so nothing checked depends on how fast goroutines run. The outcomes of
// one moment are recorded in the order the model applies them (timeouts
// answered, then writes answered); where the store's order within that
// still matters (who of two failed attempts gets which slot), the model
// finds the order that explains the store's answer.
//
// A driver for a store many processes share (Redis) implements Crash by
// cutting the old store off its data and restarting on the same data
// (Redis with AOF keeps what a throttler's kill -9 leaves), and needs the
// store to take time from Config.Clock for the fake clock to apply.

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
	// Freeze, if set, stops the process running s as SIGSTOP would (its
	// commands wait; nothing it sends reaches the data) and returns how
	// to start another process on the data (as Crash's restart: it takes
	// over once s's leases lapse) and thaw, SIGCONT: what s had under way
	// goes on, against data it no longer owns. thaw returns once s has
	// seen that (its tenures ended); the test then stops s's Consume and
	// closes it. Without Freeze, OpStale is a crash.
	Freeze func(t testing.TB, s queue.Store) (restart func(t testing.TB, c Config) (queue.Store, error), thaw func(), err error)
	// TakeStartLag, if set, reports the store's estimate of how long a
	// prompt send takes to start (it schedules as if every job arrived
	// that much later) and resets it to zero. On the fake clock sends start
	// at once, so anything but zero is the estimate measuring something
	// else; it is reset so that the model can go on.
	TakeStartLag func(s queue.Store) time.Duration
	// SentBy, if set, reads from a store just restarted after a crash at
	// now the latest moment the process before it may have written a
	// request (the embedded store's lease on sending, no later than now).
	// Such a store counts each waiting job due by then, which may have
	// been written with no outcome recorded, in its tenant's windows at
	// that moment (rules.RestartPickup), and the model does too. Without
	// it the windows keep such a job at its slot.
	SentBy func(s queue.Store, now time.Time) time.Time
	// Quiet, if set, reports whether the store's own background work is
	// idle: every wake-up it was given has been taken and it waits for the
	// clock again. The test moves the fake clock only when it is, so that
	// the store never computes a wait from a time that has passed. Without
	// it the test only watches for new waits on the clock, which a busy
	// machine can outrun.
	Quiet func(s queue.Store) bool
	// Busy, if set, says what keeps the store from being Quiet (for a
	// failure to settle).
	Busy func(s queue.Store) string
	// TAT, if set, reads a tenant's schedule: the theoretical arrival time
	// of its next job, in tenant time. The model compares it with its own
	// after every step (the first place two schedules part), and after a
	// restart checks it against what DESIGN.md requires (no sooner than
	// the last moment a job could have been written allows) and then takes
	// it: how much later than that a restart starts is the store's choice.
	// Without it the model infers the schedule from Tenant's expected delay
	// where it can.
	TAT func(s queue.Store, tenant string) (time.Time, error)
	// Windows, if set, is the sends a store counts in a tenant's window w
	// (tenant time): after a restart that places its jobs anew the model
	// takes them, as it takes TAT. Without it the model keeps its own.
	Windows func(s queue.Store, tenant string, w leaky.Window) ([]time.Time, error)
	// Durable: every change of a tenant's schedule is written as it is
	// made (Redis, where the schedule lives in the server), so a crash
	// takes none of it back; without it the model goes back to the
	// schedule as last written with the tenant's record (the embedded
	// store gives back a cancelled job's place in memory only).
	Durable bool
	// Known are the defects the store is known to have: the checks they
	// break are relaxed as Defect says, so that the rest still runs.
	Known Defect
}

// Defect is a known defect of a store that the model can
// tolerate, as a set of flags.
type Defect uint

const (
	// DefectStartLag: the start-lag estimate picks up waits
	// that are not the start of a send (a resend after a crash, a Retry of
	// an old failed job). Tolerated: a nonzero TakeStartLag is not a
	// failure.
	DefectStartLag Defect = 1 << iota
	// DefectCountRetryAfter (the part left): a refusal by
	// the count bound without windows (jobs waiting to retry, a pause) says
	// Retry-After of one interval instead of the time until the job would
	// be admitted. Tolerated: such a Retry-After is not checked. (Fixed
	// in both stores.)
	DefectCountRetryAfter
	// DefectRestartCost (found by the model): a restart spaces the next
	// send one interval after the last possible one, whatever that job's
	// cost (the schedule gives a cost-c job c intervals). Tolerated: after
	// a restart the weighted spacing starts from one interval. (Fixed in
	// the embedded store.)
	DefectRestartCost
	// DefectRepeatCost (found by the model): a repeat of an admitted
	// idempotency key whose cost the policy no longer allows (a reload
	// lowered it) is answered 422 cost_too_large instead of the first
	// answer, although the job was admitted and will be sent. Tolerated:
	// that answer is accepted. (Fixed in both stores.)
	DefectRepeatCost
	// DefectBatchWindow (found by the model, in the fix of #4): with
	// windows, the count of jobs that wait leaves out the jobs admitted
	// earlier in the same Enqueue call (they join the schedule only after
	// the commit), so one batch admits any number. Tolerated: the model
	// counts as the store does. (Fixed in the embedded store.)
	DefectBatchWindow
	// DefectWindowRetryAfter (the part left): in token mode
	// with windows, a job the rate refuses is told the rate's Retry-After
	// even when a full window refuses it for longer; in leaky mode, when
	// more than capacity jobs wait (retries, DefectBatchWindow), it is told
	// when the first of them stops waiting, not when enough have.
	// Tolerated: those Retry-Afters are not checked. (Fixed in both
	// stores.)
	DefectWindowRetryAfter
	// DefectPushbackWindow (found by the model): a job answered 429 is
	// sent again when the pause ends whatever its windows hold (each
	// resend counts at the same slot in tenant time, so the bookkeeping
	// never holds it back, and the jobs already scheduled do not move
	// for it): only the dispatcher's gate keeps the window. Tolerated:
	// resends are left out of the window check.
	DefectPushbackWindow
	// DefectRetryPacing (found by the model): a retry takes the next place
	// in the schedule but is sent at the end of its backoff when that is
	// later, so it can go within an interval of the job that holds the
	// place after it (two sends in one slot at burst 1): the store relies
	// on the dispatcher's gate to space them. Cancelling such a retry
	// also gives back a place it never held (Cancel takes a job whose slot
	// ends at the schedule's end for the last one), so the next job shares
	// the slot of the one before. Tolerated: those writes are not checked
	// against the rate. (Fixed in both stores: such a retry is booked at
	// its backoff's end, queue.TenantRecord.Booked, and the jobs admitted
	// meanwhile are placed around it; neither model test passes the flag.)
	DefectRetryPacing
	// DefectRetryCost (found by the model): Store.Retry of a failed job
	// whose cost the policy no longer allows (a reload lowered capacity,
	// burst or a window) answers 429 with a Retry-After after which it is
	// refused again, for ever, instead of 422 cost_too_large. Tolerated:
	// the 429 is accepted. (Fixed in both stores.)
	DefectRetryCost
	// DefectPushbackBurst (found by the model): jobs sent together in a
	// burst and answered 429 keep their (same) slot, so they are all sent
	// again at once when the pause ends: a burst right after the pause
	// (DESIGN 3.6: "no burst after the pause"). Tolerated: resends after a
	// 429 are not checked against the rate. (Fixed in both stores: a job
	// answered 429 during a pause another's began, whose resend would go
	// with that one's, takes the schedule's next place; neither model
	// test passes the flag.)
	DefectPushbackBurst
	// DefectWindowFuture (found by the model): the window rule counts every
	// recorded send as if it came before the new one, so a send scheduled
	// later in the window (a retry's slot) holds back a job that fits now:
	// in token mode it is refused although it has a token and room
	// (invariant 3). Tolerated: that refusal is accepted.
	DefectWindowFuture
	// DefectHeldRestart (found by the model, by another way too):
	// a restart leaves a held tenant's jobs as they were, so one whose
	// write was lost in the crash is sent again the moment the operator
	// resumes, however soon after that write. Tolerated: that resend is
	// not checked against the rate and windows. (Fixed in the embedded
	// store.)
	DefectHeldRestart
	// DefectLateExpiry (found by the model): a job that enters a held
	// tenant's schedule (admitted, or back from a failed attempt) does not
	// wake the dispatcher for its deadline, so it is expired only at the
	// next poll, up to a second late, and counts in the depth (and against
	// the room) meanwhile. Tolerated: the model expires such a job when
	// the store does. (Fixed in both stores: no driver tolerates it; the
	// flag is kept for HeldDeadline, which shows it failing without.)
	DefectLateExpiry
	// DefectRestartOverdue (found by the model on Redis): a new owner's
	// takeover left the waiting jobs whose slots passed while nobody sent
	// them (a crash and its downtime), or that a write lost in the crash
	// makes too soon, at those slots: Store.Job said a dispatch_at before
	// the restart or sooner than the tenant's last writes allow, and the
	// owner handed them over with those dispatch times (its floor and pace
	// in memory only). Fixed for the rate: takeover.lua writes the slots
	// it moves, from the restart (a lost write's cost after it), a cost
	// apart; and by the windows (TakeoverWindow). No driver
	// tolerates it now; the flag is kept for the cases that show it
	// failing without. Tolerated: until it is written such a
	// job's dispatch_at, write time, rate and windows are not checked (the
	// model places it as the embedded store would, from the restart, a
	// cost apart, for what comes after it).
	DefectRestartOverdue
	// DefectSlowReloadPromise (found by the random run on Redis, seed
	// 134): after a reload to a slower rate, a job admitted behind jobs
	// (or a recent send) spaced at the old rate is placed by the old
	// schedule's end, but the dispatcher's gate (and Redis's owner, which
	// reads the gate ahead) holds those jobs, and it after them, to the
	// new rate: its expected_delay is short by up to the difference of
	// the intervals per job ahead. Both stores do it; the model sees it on
	// Redis only (its embedded-store driver has no gate). Tolerated: a
	// first write the rate in force held back (mjob.latest) past its
	// promise is not a broken promise, once a reload has slowed the rate.
	DefectSlowReloadPromise
)

// ModelFailure is what a model run found.
type ModelFailure struct {
	Step int // index of the op (len(ops): the final drain)
	Op   Op
	At   time.Duration // fake time since T0
	// Kind is the check that failed; a shrink keeps it.
	Kind string
	Msg  string
	// Trace is the run's trace (unless THROTTLER_MODEL_TRACE logged it).
	Trace string
}

func (f *ModelFailure) Error() string {
	return fmt.Sprintf("step %d (%v) at T0+%v: %s: %s", f.Step, f.Op, f.At, f.Kind, f.Msg)
}

// RunModel runs seeds random sequences of steps operations each (seeds 1
// to seeds), several at once. THROTTLER_MODEL_SEEDS and
// THROTTLER_MODEL_STEPS override the numbers (a soak);
// THROTTLER_MODEL_SEED=N starts at seed N (alone, unless
// THROTTLER_MODEL_SEEDS says how many). A failing seed is shrunk and
// printed, with its first run's trace (a seed that fails only now and
// then, beside the others, shows what it did).
func RunModel(t *testing.T, d ModelDriver, seeds, steps int) {
	first := 1
	if one := envInt("THROTTLER_MODEL_SEED", 0); one > 0 {
		first, seeds = one, 1
	}
	seeds = envInt("THROTTLER_MODEL_SEEDS", seeds)
	steps = envInt("THROTTLER_MODEL_STEPS", steps)
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
				if f.Trace != "" {
					t.Logf("seed %d failed; its trace:%s", seed, f.Trace)
				}
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
			if i < len(cur) && (cur[i].Kind == OpAdvance || cur[i].Kind == OpCrash || cur[i].Kind == OpStale) && cur[i].D > modelGrid {
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
