package redis

import (
	"context"
	_ "embed"
	"errors"
	"time"

	"github.com/hibiken/asynq"

	"throttler/internal/startstop"
)

var (
	//go:embed recover.lua
	recoverLua    string
	recoverScript = newScript("recover.lua", recoverLua, true)
)

// recoverLimit is the most jobs one run takes back per shard.
const recoverLimit = 100

// recoverer takes back, every quarter of a lease (at least every second),
// the jobs of workers whose leases ran out (they crashed holding them):
// each gets a new task, due at once, and goes again with the same
// Idempotency-Key. After Redis was away from this process it waits a lease
// first, so that live workers renew theirs before anything is taken.
type recoverer struct {
	startstop.Periodic
	s *Store
}

func newRecoverer(s *Store) *recoverer {
	r := &recoverer{s: s}
	r.Periodic = startstop.Periodic{Name: "recoverer", Every: max(s.timing.Lease/4, time.Second), Run: r.exec}
	return r
}

func (r *recoverer) exec(ctx context.Context) {
	if time.Since(time.Unix(0, r.s.trouble.Load())) <= r.s.timing.Lease {
		return // every lease may have lapsed while Redis was away
	}
	for shard := range Shards {
		if err := r.recoverShard(ctx, keysOf(shard)); err != nil && ctx.Err() == nil {
			r.s.markTrouble()
			r.s.log.Warn("cannot take back crashed workers' jobs", "err", err)
		}
	}
}

// recovered is one job recover.lua took back, and its new task.
type recovered struct{ job, task, tenant string }

type recoveredList []recovered

func (l *recoveredList) decode(r *reply) {
	r.each(func(r *reply) {
		*l = append(*l, recovered{job: r.str(), task: r.str(), tenant: r.str()})
	})
}

func (r *recoverer) recoverShard(ctx context.Context, k shardKeys) error {
	s := r.s
	var taken recoveredList
	if err := recoverScript.run(ctx, s.rdb, []string{k.inflight(), k.handoff()}, []any{s.now(), k.tag, recoverLimit}, &taken); err != nil {
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
