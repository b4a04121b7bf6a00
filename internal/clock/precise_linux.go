package clock

import (
	"syscall"
	"time"
)

const (
	canSleepOnThread = true
	prSetTimerSlack  = 29 // PR_SET_TIMERSLACK
)

// sleepOnThread sleeps d in nanosleep: the kernel's high-resolution timer,
// not the Go runtime's poller.
func sleepOnThread(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	// The thread's timer slack (50 µs by default) would add to every wake.
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0)
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
	return true
}
