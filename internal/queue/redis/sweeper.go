package redis

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/queue"
)

var (
	//go:embed handoff.lua
	handoffLua    string
	handoffScript = newScript("handoff.lua", handoffLua, false)
)

// handoffAge is how long a job may sit in the hand-off set before the
// sweeper checks that its task exists: well past the moment between the
// admission script and asynq's enqueue.
const handoffAge = 5 * time.Second

// sweepLimit is the most hand-off entries one run reads per shard.
const sweepLimit = 500

// newSweeper is the sweeper: every quarter of a lease (at least every
// second) it makes the asynq tasks of jobs left in the hand-off set:
// admitted (or taken back) by a process that stopped, or lost Redis,
// before it made their tasks.
func newSweeper(s *Store) *shardPass {
	return newShardPass(s, "sweeper", "cannot sweep the hand-off set", nil, s.sweepShard)
}

// sweepShard makes the missing tasks of shard k's hand-off set.
func (s *Store) sweepShard(ctx context.Context, k shardKeys) error {
	now, err := s.serverNow(ctx)
	if err != nil {
		return err
	}
	entries, err := s.rdb.ZRangeByScoreWithScores(ctx, k.handoff(), &goredis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(micros(now.Add(-handoffAge)), 10), Count: sweepLimit}).Result()
	if err != nil || len(entries) == 0 {
		return err
	}
	jobs, err := s.readEntries(ctx, k, entries)
	if err != nil {
		return err
	}
	var done []any
	for i, e := range entries {
		j := jobs[i]
		if j.waiting && !j.taskExists {
			// Due at once: the claim tells the task how long to wait.
			err := s.enqueueTask(ctx, j.id, j.tenant, j.task, time.Time{})
			if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
				return err
			}
			if err == nil {
				s.log.Info("made the asynq task of a job whose admitting process stopped first", "job", j.id)
			}
		}
		done = append(done, j.id, strconv.FormatFloat(e.Score, 'f', -1, 64))
	}
	return handoffScript.Run(ctx, s.rdb, []string{k.handoff()}, done, nil)
}

// handoffJob is what the sweeper reads of a job in the hand-off set.
type handoffJob struct {
	id, task, tenant    string
	waiting, taskExists bool
}

// readEntries reads the jobs of the hand-off entries and whether their
// tasks exist, in two pipelines.
func (s *Store) readEntries(ctx context.Context, k shardKeys, entries []goredis.Z) ([]handoffJob, error) {
	out := make([]handoffJob, len(entries))
	cmds := make([]*goredis.SliceCmd, len(entries))
	if _, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, e := range entries {
			out[i].id, _ = e.Member.(string)
			cmds[i] = p.HMGet(ctx, k.job(out[i].id), "task", "state", "tenant")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	exists := make([]*goredis.IntCmd, len(entries))
	if _, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, c := range cmds {
			v := c.Val()
			out[i].task, _ = v[0].(string)
			state, _ := v[1].(string)
			out[i].tenant, _ = v[2].(string)
			out[i].waiting = queue.JobState(state).Waiting()
			exists[i] = p.Exists(ctx, k.task(out[i].task))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for i, c := range exists {
		out[i].taskExists = c.Val() == 1
	}
	return out, nil
}
