//go:build !linux

package clock

import "time"

const canSleepOnThread = false

func sleepOnThread(time.Duration) bool { return false }
