// Package testutil holds what tests of several packages share and nothing
// else: waiting for a condition with a deadline, whether the race detector
// is on, the programs a test needs, and the auth tokens of a test's
// config.
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
