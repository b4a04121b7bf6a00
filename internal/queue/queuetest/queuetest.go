// Package queuetest is the conformance suite every queue.Store backend
// passes: the same decisions, states and errors, on a fake clock. A backend
// runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		queuetest.Run(t, queuetest.Driver{New: func(t *testing.T) queuetest.Open { ... }})
//	}
//
// (as River's riverdrivertest). The suite's tests are grouped by topic, a
// file each: admission, consume, pause, deadlines, windows, ceilings,
// restart, responses (a job's request and answers kept with it), handlers
// (a job's type, and a Go handler's cancel), callbacks (what a job's end
// owes its producer), finishes (who waits for a job's end is told).
package queuetest

import (
	"testing"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Config is what a test asks of the store it opens.
type Config struct {
	Clock  clock.Clock
	Policy queue.PolicyFunc
	// Ceiling gives tenants' downstream ceilings (nil: none).
	Ceiling queue.CeilingFunc
	// Caps gives tenants' caps on attempts in flight (nil: none).
	Caps queue.CapsFunc
}

// Open opens a store on one test's data. Calling it again after Close
// reopens the same data: a restart.
type Open func(t *testing.T, c Config) queue.Store

// Driver is a backend under test.
type Driver struct {
	// New returns an Open on fresh data, one per test.
	New func(t *testing.T) Open
	// RestartRespaces: a reopen is a restart of the only process using
	// the data (the embedded store), which re-spaces jobs whose time
	// passed while it was stopped. A store many processes share has no
	// such moment: the tests that need it are skipped.
	RestartRespaces bool
}

// Run runs the whole suite, each test in parallel on data of its own.
func Run(t *testing.T, d Driver) {
	tests := []struct {
		name string
		run  func(*testing.T, Driver)
	}{
		{"BurstAgainstCapacity", testBurstAgainstCapacity},
		{"TokenMode", testTokenMode},
		{"BatchDecidesInOrder", testBatchDecidesInOrder},
		{"Idempotency", testIdempotency},
		{"CostTakesSlots", testCostTakesSlots},
		{"CostAfterAReload", testCostAfterAReload},
		{"JobLookupAndCancel", testJobLookupAndCancel},
		{"CancellingTheLastJobGivesItsPlaceBack", testCancellingTheLastJobGivesItsPlaceBack},
		{"TenantsDeepestFirst", testTenantsDeepestFirst},
		{"ConsumeDeliversAtSlotsInOrder", testConsumeDeliversAtSlotsInOrder},
		{"RetryFailAndRelease", testRetryFailAndRelease},
		{"RetryBackoffDoesNotFillTheQueue", testRetryBackoffDoesNotFillTheQueue},
		{"FailedJobsListedAndRetried", testFailedJobsListedAndRetried},
		{"PushbackPausesTheTenantAndKeepsOrder", testPushbackPausesTheTenantAndKeepsOrder},
		{"OperatorHoldAndResume", testOperatorHoldAndResume},
		{"Deadlines", testDeadlines},
		{"DeadlinesInThePast", testDeadlinesInThePast},
		{"LongHorizonIsExact", testLongHorizonIsExact},
		{"WindowBesideTheRate", testWindowBesideTheRate},
		{"WindowsKeepTheQueueBound", testWindowsKeepTheQueueBound},
		{"FullWindowRetryAfterIsExact", testFullWindowRetryAfterIsExact},
		{"ExpectedDelayCountsTheCeiling", testExpectedDelayCountsTheCeiling},
		{"CeilingWindowsBoundTheCost", testCeilingWindowsBoundTheCost},
		{"RetryCountsTheCeiling", testRetryCountsTheCeiling},
		{"CapsHoldAttemptsInFlight", testCapsHoldAttemptsInFlight},
		{"CapsCountRetries", testCapsCountRetries},
		{"CapsSetByAReloadCountWhatIsInFlight", testCapsSetByAReloadCountWhatIsInFlight},
		{"PolicyChangeRepacesTheBacklog", testPolicyChangeRepacesTheBacklog},
		{"PolicyChangeKeepsANotBefore", testPolicyChangeKeepsANotBefore},
		{"PolicyChangeGoesAroundScheduledJobs", testPolicyChangeGoesAroundScheduledJobs},
		{"PolicyChangeWithALongBacklogInAWindow", testPolicyChangeWithALongBacklogInAWindow},
		{"ScheduledJobsWaitForTheirTime", testScheduledJobsWaitForTheirTime},
		{"ScheduledJobReleasedIsCountedOnce", testScheduledJobReleasedIsCountedOnce},
		{"NotBeforeToTheNanosecond", testNotBeforeToTheNanosecond},
		{"RestartKeepsJobsAndSpacesOverdueOnes", testRestartKeepsJobsAndSpacesOverdueOnes},
		{"RestartMovesALongBacklogInAWindowByTheStop", testRestartMovesALongBacklogInAWindowByTheStop},
		{"RequestsAndAnswersAreKept", testRequestsAndAnswersAreKept},
		{"TypesAndHandlerCancels", testTypesAndHandlerCancels},
		{"CallbacksOwedWithTheFinalState", testCallbacksOwedWithTheFinalState},
		{"FinalStatesTellTheirWatchers", testFinalStatesTellTheirWatchers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, d)
		})
	}
}

// start opens a fresh store for one test, on a fake clock at T0.
func (d Driver) start(t *testing.T, policy queue.PolicyFunc) (*clock.Fake, queue.Store) {
	t.Helper()
	clk, s, _ := d.startWith(t, Config{Policy: policy})
	return clk, s
}

// startWith opens a fresh store for one test as c asks, on a fake clock
// at T0. The returned reopen opens the same data again with the same
// clock and config: after a Close, a restart.
func (d Driver) startWith(t *testing.T, c Config) (clk *clock.Fake, s queue.Store, reopen func() queue.Store) {
	t.Helper()
	clk = clock.NewFake(T0)
	c.Clock = clk
	open := d.New(t)
	reopen = func() queue.Store {
		t.Helper()
		return open(t, c)
	}
	return clk, reopen(), reopen
}
