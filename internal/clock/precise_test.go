package clock

import (
	"runtime"
	"testing"
	"time"
)

// A precise sleep never ends early (the gate relies on it to send no
// earlier than a slot), and a clock that cannot sleep precisely says so,
// so that its caller waits on a timer instead.
func TestSleepPrecise(t *testing.T) {
	if SleepPrecise(NewFake(time.Unix(0, 0)), time.Millisecond) {
		t.Fatal("a fake clock slept on a thread")
	}
	if SleepPrecise(Real{}, PreciseWindow+time.Microsecond) {
		t.Fatal("slept past the precise window")
	}
	for _, d := range []time.Duration{0, 10 * time.Microsecond, 700 * time.Microsecond, PreciseWindow} {
		start := time.Now()
		slept := SleepPrecise(Real{}, d)
		if took := time.Since(start); slept && took < d {
			t.Errorf("slept %v for %v", took, d)
		}
		if want := runtime.GOOS == "linux"; slept != want {
			t.Errorf("SleepPrecise(%v) = %v on %s", d, slept, runtime.GOOS)
		}
	}
}
