//go:build !unix

package dispatch

import "time"

// processCPU is not measured here: benchmarks report 0 CPU per operation.
func processCPU() time.Duration { return 0 }
