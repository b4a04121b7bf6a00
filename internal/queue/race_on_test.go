//go:build race

package queue

// raceEnabled: under the race detector code runs 5-10x slower and timing is
// not what ships, so timing assertions are checked in the plain test run.
const raceEnabled = true
