package redis

import (
	"context"
	_ "embed"
	"errors"
	"time"

	"github.com/hibiken/asynq"

	"throttler/internal/luascript"
)

var (
	//go:embed recover.lua
	recoverLua    string
	recoverScript = newScript("recover.lua", recoverLua, true)
)

// recoverLimit is the most jobs one run takes back per shard.
const recoverLimit = 100

// newRecoverer is the recoverer: every quarter of a lease (at least every
// second) it takes back the jobs of workers whose leases ran out (they
// crashed holding them): each gets a new task, due at once, and goes again
// with the same Idempotency-Key. After Redis was away from this process it
// waits a lease first, so that live workers renew theirs before anything
// is taken.
func newRecoverer(s *Store) *shardPass {
	return newShardPass(s, "recoverer", "cannot take back crashed workers' jobs", s.troubleWithinLease, s.recoverShard)
}

// troubleWithinLease is whether Redis was away from this process less than
// a lease ago: every lease may have lapsed meanwhile.
func (s *Store) troubleWithinLease() bool {
	return time.Since(time.Unix(0, s.trouble.Load())) <= s.timing.Lease
}

// recovered is one job recover.lua took back, and its new task.
type recovered struct{ job, task, tenant string }

type recoveredList []recovered

func (l *recoveredList) Decode(r *luascript.Reply) {
	r.Each(func(r *luascript.Reply) {
		*l = append(*l, recovered{job: r.Str(), task: r.Str(), tenant: r.Str()})
	})
}

// recoverShard takes back shard k's jobs whose leases ran out.
func (s *Store) recoverShard(ctx context.Context, k shardKeys) error {
	var taken recoveredList
	if err := recoverScript.Run(ctx, s.rdb, []string{k.inflight(), k.handoff()}, []any{s.now(), k.tag, recoverLimit}, &taken); err != nil {
		return err
	}
	for _, t := range taken {
		s.log.Warn("took back a job whose worker stopped renewing its lease (it crashed?); it goes again with the same Idempotency-Key", "job", t.job)
		if err := s.enqueueTask(ctx, t.job, t.tenant, t.task, time.Time{}); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			return err // it stays in the hand-off set: the sweeper makes its task
		}
	}
	return nil
}
