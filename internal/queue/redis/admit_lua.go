package redis

import (
	_ "embed"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// admitLua is the admission decision as one Redis script: the Redis
// backend's atomic step, with the same rules as admit (checked against it
// in admit_lua_test.go).
//
//go:embed admit.lua
var admitLua string

var admitScript = goredis.NewScript(admitLua)

// pauseLua changes a tenant's pause (leaky.Pause) and floors its TAT, as
// the embedded store does.
//
//go:embed pause.lua
var pauseLua string

var pauseScript = goredis.NewScript(pauseLua)

// enqueueLua admits and keeps a batch of jobs; admit.lua is its decision,
// loaded as a function (its KEYS and ARGV become the function's own).
//
//go:embed enqueue.lua
var enqueueLua string

// libLua holds helpers put in front of the scripts that use them.
//
//go:embed lib.lua
var libLua string

var enqueueScript = goredis.NewScript(libLua + "local function admit_decision(KEYS, ARGV)\n" + admitLua + "\nend\n" + enqueueLua)

var (
	//go:embed claim.lua
	claimLua string
	//go:embed cancel.lua
	cancelLua string
	//go:embed gate.lua
	gateLua string
	//go:embed gatehold.lua
	gateHoldLua string
	//go:embed recover.lua
	recoverLua string
	//go:embed lease.lua
	leaseLua string
	//go:embed finish.lua
	finishLua string
	//go:embed handoff.lua
	handoffLua string
	//go:embed settle.lua
	settleLua string

	claimScript    = goredis.NewScript(libLua + claimLua)
	cancelScript   = goredis.NewScript(libLua + cancelLua)
	gateScript     = goredis.NewScript(gateLua)
	gateHoldScript = goredis.NewScript(gateHoldLua)
	recoverScript  = goredis.NewScript(libLua + recoverLua)
	leaseScript    = goredis.NewScript(libLua + leaseLua)
	finishScript   = goredis.NewScript(libLua + finishLua)
	handoffScript  = goredis.NewScript(handoffLua)
	settleScript   = goredis.NewScript(libLua + settleLua)
)

// micros is t in whole microseconds since 1970: the scripts' time unit.
func micros(t time.Time) int64 { return t.UnixMicro() }

// fromMicros is the time of a script's microseconds (0: the zero time).
func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// microsOf is t in microseconds, 0 for the zero time.
func microsOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return micros(t)
}
