//go:build unix

package dispatch

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used (user and system), for
// benchmarks that report CPU per operation: on a shared machine it moves
// less than wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
