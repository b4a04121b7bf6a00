package redis

import (
	"context"
	"time"

	"throttler/internal/startstop"
)

// shardPass is the shape the recoverer and the sweeper share: every
// quarter of a lease (at least every second), one pass over every shard.
// A shard that fails (Redis is away) marks the store in trouble and is
// logged; the next pass tries it again.
type shardPass struct {
	startstop.Periodic
	s    *Store
	warn string                                       // the log line of a shard that fails
	skip func() bool                                  // nil, or whether to skip this pass
	pass func(ctx context.Context, k shardKeys) error // one shard's pass
}

func newShardPass(s *Store, name, warn string, skip func() bool, pass func(context.Context, shardKeys) error) *shardPass {
	p := &shardPass{s: s, warn: warn, skip: skip, pass: pass}
	p.Periodic = startstop.Periodic{Name: name, Every: max(s.timing.Lease/4, time.Second), Run: p.exec}
	return p
}

func (p *shardPass) exec(ctx context.Context) {
	if p.skip != nil && p.skip() {
		return
	}
	for shard := range Shards {
		if err := p.pass(ctx, keysOf(shard)); err != nil && ctx.Err() == nil {
			p.s.markTrouble()
			p.s.log.Warn(p.warn, "err", err)
		}
	}
}
