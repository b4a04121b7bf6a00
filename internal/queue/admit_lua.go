package queue

import (
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

// admitLua is the admission decision as one Redis script: the Redis
// backend's atomic step, with the same rules as admit (checked against it
// in admit_lua_test.go).
//
//go:embed admit.lua
var admitLua string

var admitScript = redis.NewScript(admitLua)

// pauseLua changes a tenant's pause (leaky.Pause) and floors its TAT, as
// the embedded store does.
//
//go:embed pause.lua
var pauseLua string

var pauseScript = redis.NewScript(pauseLua)

// micros is t in whole microseconds since 1970: the scripts' time unit.
func micros(t time.Time) int64 { return t.UnixMicro() }
