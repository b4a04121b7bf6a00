package owner

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/queue"
)

// script is one of this package's Lua scripts, named by its file.
type script struct {
	name string
	lua  *goredis.Script
}

func newScript(name, src string) *script {
	return &script{name: name, lua: goredis.NewScript(src)}
}

// decoder is a script's reply as a named struct: it reads its fields in
// the order the script's header gives them.
type decoder interface{ decode(r *reply) }

// run runs the script and decodes its reply into dst. A script that
// cannot run (Redis is away) is queue.ErrUnavailable; a reply of another
// shape than dst's is an error that names the script and the item.
func (sc *script) run(ctx context.Context, rdb goredis.Scripter, keys []string, args []any, dst decoder) error {
	v, err := sc.lua.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return queue.Unavailable(err)
	}
	return sc.decode(v, dst)
}

func (sc *script) decode(v any, dst decoder) error {
	if err := decodeList(v, dst.decode); err != nil {
		return fmt.Errorf("%s: its reply: %w", sc.name, err)
	}
	return nil
}

// call is one run of a script in a batch.
type call struct {
	keys []string
	args []any
}

// runEach runs the script once per call in one pipeline (one round trip;
// on a Cluster, one per node), decoding each reply with newDst's value.
// errs[i] is call i's error. After a Redis restart (its script cache is
// empty) the calls refused with NOSCRIPT run again one by one, loading it.
func (sc *script) runEach(ctx context.Context, rdb goredis.UniversalClient, calls []call, dsts []decoder) (errs []error) {
	errs = make([]error, len(calls))
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = sc.lua.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if goredis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = sc.lua.Run(ctx, rdb, calls[i].keys, calls[i].args...).Result()
		}
		if err != nil {
			errs[i] = queue.Unavailable(err)
			continue
		}
		errs[i] = sc.decode(v, dsts[i])
	}
	return errs
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
	if !ok {
		r.wrong("an integer", v)
	}
	return n
}

// str reads a string.
func (r *reply) str() string {
	v := r.item("a string")
	s, ok := v.(string)
	if !ok {
		r.wrong("a string", v)
	}
	return s
}

// rest reads the remaining items as strings.
func (r *reply) rest() []string {
	var l []string
	for r.err == nil && r.next < len(r.items) {
		l = append(l, r.str())
	}
	return l
}
