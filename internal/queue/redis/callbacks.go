package redis

import (
	"context"
	_ "embed"
	"errors"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
)

// The callbacks jobs' ends owe (DESIGN.md section 6b): each job's hash
// keeps its callback (cbu, cbon) and, once owed, its state (cbs, cba,
// cbe, cbn: state, attempts, last error, next due); each partition's
// callbacks zset holds the pending ones by when they are next due. A
// callback is owed in the script (or transaction) that writes the final
// state (lib.lua's owe_callbacks, oweCallback). Any process may send them:
// a callback is taken for a lease (callbacks.lua), not owned.
var (
	//go:embed callbacks.lua
	callbacksLua    string
	callbacksScript = newScript("callbacks.lua", callbacksLua, true)
	//go:embed callbackdone.lua
	callbackDoneLua    string
	callbackDoneScript = newScript("callbackdone.lua", callbackDoneLua, false)
)

func (k partKeys) callbacks() string { return k.tag + "callbacks" }

// oweCallback is lib.lua's owe_callbacks for finishByRule's transaction.
func oweCallback(ctx context.Context, pipe goredis.Pipeliner, k partKeys, j queue.Job, now time.Time) {
	if !j.Callback.Owed(j.State) {
		return
	}
	pipe.HSet(ctx, k.job(j.ID), "cbs", queue.CallbackPending, "cba", 0, "cbe", "", "cbn", micros(now))
	pipe.ZAdd(ctx, k.callbacks(), goredis.Z{Score: float64(micros(now)), Member: j.ID})
}

// callbackURLArg and callbackOnArg are a job's callback as enqueue.lua
// keeps it: its URL (” none) and its states, comma-separated (” all).
func callbackURLArg(c *queue.JobCallback) string {
	if c == nil {
		return ""
	}
	return c.URL
}

func callbackOnArg(c *queue.JobCallback) string {
	if c == nil {
		return ""
	}
	on := make([]string, len(c.On))
	for i, st := range c.On {
		on[i] = string(st)
	}
	return strings.Join(on, ",")
}

// takenCallbacks is callbacks.lua's answer: the jobs' hashes.
type takenCallbacks []map[string]string

func (t *takenCallbacks) Decode(r *luascript.Reply) {
	r.Each(func(r *luascript.Reply) { *t = append(*t, r.Hash()) })
}

// DueCallbacks implements queue.Store. It looks at every
// partition's earliest callback in one round trip, then takes from those
// with one due.
func (s *Store) DueCallbacks(ctx context.Context, limit int, lease time.Duration) ([]queue.Job, error) {
	now := s.Clock().Now()
	cmds := make([]*goredis.ZSliceCmd, s.partitions)
	_, err := s.rdb.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		for p := range s.partitions {
			cmds[p] = pipe.ZRangeArgsWithScores(ctx, goredis.ZRangeArgs{Key: keysOf(p).callbacks(), Start: 0, Stop: 0})
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return nil, queue.Unavailable(err)
	}
	var out []queue.Job
	for p, cmd := range cmds {
		first := cmd.Val()
		if len(first) == 0 || fromMicros(int64(first[0].Score)).After(now) || len(out) >= limit {
			continue
		}
		k := keysOf(p)
		var taken takenCallbacks
		err := callbacksScript.Run(ctx, s.rdb, []string{k.callbacks()}, []any{s.now(), lease.Microseconds(), limit - len(out), k.tag}, &taken)
		if err != nil {
			return out, queue.Unavailable(err)
		}
		for _, h := range taken {
			out = append(out, jobFromHash(h))
		}
	}
	return out, nil
}

// CallbackAttempted implements queue.Store.
func (s *Store) CallbackAttempted(ctx context.Context, id string, a queue.CallbackAttempt) error {
	part, ok := s.partOfID(id)
	if !ok {
		return queue.ErrNotFound
	}
	k := keysOf(part)
	outcome, retry := "retry", int64(0)
	switch {
	case a.Delivered:
		outcome = queue.CallbackDelivered
	case a.Retry.IsZero():
		outcome = queue.CallbackFailed
	default:
		retry = micros(a.Retry)
	}
	if _, err := callbackDoneScript.RunInt(ctx, s.rdb, []string{k.job(id), k.callbacks()}, []any{id, outcome, a.Error, retry}); err != nil {
		return queue.Unavailable(err)
	}
	return nil
}
