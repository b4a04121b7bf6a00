// Package testutil holds what tests of several packages share and nothing
// else: waiting for a condition with a deadline, the machine's stalls a
// promise on real time may be late by, whether the race detector
// is on, the programs a test needs, the auth tokens of a test's config,
// and which tests the quick edit loop (go test -short) leaves out.
package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every millisecond until it holds, and fails the test
// with what if it does not within timeout. Tests wait on conditions, never
// on a bare sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// SkipShort skips the test under -short, the quick edit loop: why says
// what makes it too slow for that loop (a child process it builds, kills
// and restarts, a browser, a soak, many model seeds, a load). The full run
// (no -short, as CI runs it) keeps it. Call it first, before t.Parallel.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("full run only (not under -short: " + why + ")")
	}
}
