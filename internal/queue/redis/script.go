package redis

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
)

// libLua holds helpers put in front of the scripts that use them.
//
//go:embed lib.lua
var libLua string

// newScript is the script of file name, with lib.lua's helpers in front of
// it if withLib. Its runs and replies are luascript's: checked, and
// queue.ErrUnavailable when it cannot run.
func newScript(name, src string, withLib bool) *luascript.Script {
	if withLib {
		src = libLua + src
	}
	return luascript.New(name, src)
}

// micros is t in whole microseconds since 1970: the scripts' time unit.
func micros(t time.Time) int64 { return t.UnixMicro() }

// fromMicros is the time of a script's microseconds (0: the zero time).
func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// microsUp is t in whole microseconds, rounded up: a not_before kept to
// the microsecond below it would let its job go before it.
func microsUp(t time.Time) int64 { return micros(t.Add(time.Microsecond - 1)) }

// microsOf is t in microseconds, 0 for the zero time.
func microsOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return micros(t)
}

// usCeil is d in whole microseconds, rounded up: a port of an interval
// that rounded down would send a little faster than the rate.
func usCeil(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

// flag is a yes or no as the scripts take it: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// deadlineArg is a deadline as the scripts take it: microseconds since
// 1970, any of them a deadline (one before 1970 too), or "" for none.
func deadlineArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(micros(t), 10)
}
