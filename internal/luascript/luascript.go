// Package luascript owns running a Lua script in Redis and decoding its
// reply, checked, into a named struct: one small helper, so that no script
// reads its reply by hand. A script's reply is an array whose items its
// header lists; a Decoder reads them in that order with Reply's readers,
// each of which checks the item's type, so a reply of another shape is an
// error that names the script and the item, never a zero read in silence
// or a panic.
//
// A script that cannot run (Redis is away, or refuses it) is
// queue.ErrUnavailable; one Redis refuses for its maxmemory is a
// *queue.StoreFullError. Times and durations in replies are microseconds,
// the scripts' time unit.
package luascript

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Script is one Lua script, named (by its file) in the errors of its runs.
// It is safe for concurrent use.
type Script struct {
	name string
	lua  *goredis.Script
}

// New is the script of source src, named name.
func New(name, src string) *Script {
	return &Script{name: name, lua: goredis.NewScript(src)}
}

// Name is the script's name.
func (sc *Script) Name() string { return sc.name }

// Decoder is a script's reply as a named struct: Decode reads its fields
// from the reply in the order the script's header gives them.
type Decoder interface{ Decode(r *Reply) }

// Run runs the script and decodes its reply into dst (nil: only whether
// it ran). A script that cannot run is queue.ErrUnavailable; a reply of
// another shape than dst's is an error that names the script and the
// item.
func (sc *Script) Run(ctx context.Context, rdb goredis.Scripter, keys []string, args []any, dst Decoder) error {
	v, err := sc.lua.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return runError(err)
	}
	return sc.decode(v, dst)
}

// RunInt runs a script whose reply is one integer.
func (sc *Script) RunInt(ctx context.Context, rdb goredis.Scripter, keys []string, args []any) (int64, error) {
	v, err := sc.lua.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return 0, runError(err)
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: its reply: want an integer, got %T %v", sc.name, v, v)
	}
	return n, nil
}

// Call is one run of a script in a batch (RunEach).
type Call struct {
	Keys []string
	Args []any
}

// RunEach runs the script once per call in one pipeline (one round trip;
// on a Cluster, one per node), decoding call i's reply into dsts[i] (nil:
// only whether it ran). errs[i] is call i's error, as Run's. After a Redis
// restart (its script cache is empty) the calls refused with NOSCRIPT run
// again one by one, loading it.
func (sc *Script) RunEach(ctx context.Context, rdb goredis.UniversalClient, calls []Call, dsts []Decoder) (errs []error) {
	errs = make([]error, len(calls))
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = sc.lua.EvalSha(ctx, pipe, c.Keys, c.Args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if goredis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = sc.lua.Run(ctx, rdb, calls[i].Keys, calls[i].Args...).Result()
		}
		if err != nil {
			errs[i] = runError(err)
			continue
		}
		errs[i] = sc.decode(v, dsts[i])
	}
	return errs
}

// RunEachInto is RunEach with a reply of type R for every call (a struct
// whose pointer is a Decoder), so that no caller builds the decoders
// itself: reps[i] is call i's reply, errs[i] its error.
func RunEachInto[R any, PR interface {
	*R
	Decoder
}](ctx context.Context, sc *Script, rdb goredis.UniversalClient, calls []Call) (reps []R, errs []error) {
	reps = make([]R, len(calls))
	dsts := make([]Decoder, len(calls))
	for i := range reps {
		dsts[i] = PR(&reps[i])
	}
	return reps, sc.RunEach(ctx, rdb, calls, dsts)
}

// runError is why a script did not run: queue.ErrUnavailable, except a
// fenced write's refusal ("FENCED ..."), which is Redis's error as it came
// for the writer to read (owner.Fence.Err): Redis answered, and retrying
// would be refused again; and a refusal for maxmemory ("OOM ..."), a
// *queue.StoreFullError: Redis is reachable but takes no more data, which
// admission answers 507 naming maxmemory (DESIGN.md 6c), not "cannot be
// reached". Redis refuses a script at its first write when over
// maxmemory, never after one, so nothing of the call happened.
func runError(err error) error {
	switch {
	case goredis.HasErrorPrefix(err, "FENCED"):
		return err
	case goredis.HasErrorPrefix(err, "OOM"):
		msg, _, _ := strings.Cut(err.Error(), ". script:") // the script's sha and line say nothing to an operator
		return queue.MaxmemoryError(msg)
	}
	return queue.Unavailable(err)
}

// decode decodes reply v into dst (nil: nothing to decode), naming the
// script in the error.
func (sc *Script) decode(v any, dst Decoder) error {
	if dst == nil {
		return nil
	}
	if err := DecodeList(v, dst.Decode); err != nil {
		return fmt.Errorf("%s: its reply: %w", sc.name, err)
	}
	return nil
}
