//go:build race

package testutil

// Race: under the race detector code runs 5-10x slower and timing is not
// what ships, so timing assertions are checked in the plain test run.
const Race = true
