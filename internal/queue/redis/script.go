package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/queue"
)

// libLua holds helpers put in front of the scripts that use them.
//
//go:embed lib.lua
var libLua string

// script is one of this package's Lua scripts, named by its file.
type script struct {
	name string
	lua  *goredis.Script
}

// newScript is the script of file name, with lib.lua's helpers in front of
// it if withLib.
func newScript(name, src string, withLib bool) *script {
	if withLib {
		src = libLua + src
	}
	return &script{name: name, lua: goredis.NewScript(src)}
}

// decoder is a script's reply as a named struct: it reads its fields from
// the reply in the order the script's header gives them.
type decoder interface{ decode(r *reply) }

// run runs the script and decodes its reply into dst (nil: only whether
// it ran). A script that cannot run (Redis is away) is ErrUnavailable; a
// reply of another shape than dst is an error that names the script and
// the item.
func (sc *script) run(ctx context.Context, rdb goredis.Scripter, keys []string, args []any, dst decoder) error {
	v, err := sc.lua.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return queue.Unavailable(err)
	}
	if dst == nil {
		return nil
	}
	if err := decodeList(v, dst.decode); err != nil {
		return fmt.Errorf("%s: its reply: %w", sc.name, err)
	}
	return nil
}

// runInt runs a script whose reply is one integer.
func (sc *script) runInt(ctx context.Context, rdb goredis.Scripter, keys []string, args []any) (int64, error) {
	v, err := sc.lua.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return 0, queue.Unavailable(err)
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: its reply: want an integer, got %T %v", sc.name, v, v)
	}
	return n, nil
}

// reply reads a script's reply (an array) item by item, checking each
// one's type. The first error sticks: every read after it gives zero.
type reply struct {
	items []any
	next  int
	err   error
}

// decodeList reads v, an array, with decode, which must read every item.
func decodeList(v any, decode func(*reply)) error {
	l, ok := v.([]any)
	if !ok {
		return fmt.Errorf("want an array, got %T %v", v, v)
	}
	r := &reply{items: l}
	decode(r)
	if r.err == nil && r.next < len(r.items) {
		r.err = fmt.Errorf("%d items left over", len(r.items)-r.next)
	}
	return r.err
}

// item is the next item, or nil and the error set if there is none.
func (r *reply) item(want string) any {
	if r.err != nil {
		return nil
	}
	if r.next >= len(r.items) {
		r.err = fmt.Errorf("item %d (%s): missing", r.next+1, want)
		return nil
	}
	r.next++
	return r.items[r.next-1]
}

func (r *reply) wrong(want string, v any) {
	if r.err == nil {
		r.err = fmt.Errorf("item %d: want %s, got %T %v", r.next, want, v, v)
	}
}

// int reads an integer.
func (r *reply) int() int64 {
	v := r.item("an integer")
	n, ok := v.(int64)
	if !ok && r.err == nil {
		r.wrong("an integer", v)
	}
	return n
}

// str reads a string.
func (r *reply) str() string {
	v := r.item("a string")
	s, ok := v.(string)
	if !ok && r.err == nil {
		r.wrong("a string", v)
	}
	return s
}

// flag reads an integer 0 or 1.
func (r *reply) flag() bool { return r.int() == 1 }

// time reads a time in microseconds since 1970 (0: the zero time).
func (r *reply) time() time.Time { return fromMicros(r.int()) }

// duration reads a duration in microseconds.
func (r *reply) duration() time.Duration { return time.Duration(r.int()) * time.Microsecond }

// hash reads the rest of the reply as field-value pairs (a hash).
func (r *reply) hash() map[string]string {
	h := map[string]string{}
	for r.err == nil && r.next < len(r.items) {
		h[r.str()] = r.str()
	}
	return h
}

// each reads the rest of the reply as arrays, each decoded by decode.
func (r *reply) each(decode func(*reply)) {
	for r.err == nil && r.next < len(r.items) {
		if err := decodeList(r.item("an array"), decode); err != nil {
			r.err = fmt.Errorf("item %d: %w", r.next, err)
		}
	}
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

// deadlineArg is a deadline as the scripts take it: microseconds since
// 1970, any of them a deadline (one before 1970 too), or "" for none.
func deadlineArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(micros(t), 10)
}
