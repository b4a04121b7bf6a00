package redis

import (
	"context"
	_ "embed"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Tenants' policies as the API sets them (queue.Policies): a hash of
// layers, a change counter and, per tenant, the change that last touched
// it, all in one hash slot. A process reads them all at start, then asks
// every policyPoll for what changed since (queue.PolicyChanges): one
// GET when nothing did.

var (
	//go:embed policies.lua
	policiesLua    string
	policiesScript = newScript("policies.lua", policiesLua, false)
)

const (
	policyLayersKey  = "throttler:{policies}:layers"
	policyCounterKey = "throttler:{policies}:change"
	policyChangesKey = "throttler:{policies}:changes"
)

// policyWrite is policies.lua's answer.
type policyWrite struct {
	had    bool
	change uint64
}

func (w *policyWrite) Decode(r *luascript.Reply) {
	w.had, w.change = r.Flag(), uint64(r.Int())
}

// PutPolicy keeps tenant's policy layer.
func (s *Store) PutPolicy(ctx context.Context, tenant string, layer []byte) (uint64, error) {
	var w policyWrite
	err := policiesScript.Run(ctx, s.rdb, []string{policyLayersKey, policyCounterKey, policyChangesKey}, []any{tenant, layer}, &w)
	return w.change, err
}

// DropPolicy forgets tenant's policy layer.
func (s *Store) DropPolicy(ctx context.Context, tenant string) (bool, uint64, error) {
	var w policyWrite
	err := policiesScript.Run(ctx, s.rdb, []string{policyLayersKey, policyCounterKey, policyChangesKey}, []any{tenant, ""}, &w)
	return w.had, w.change, err
}

// AllPolicies is every layer kept and the change they are as of.
func (s *Store) AllPolicies(ctx context.Context) (map[string][]byte, uint64, error) {
	var counter *goredis.StringCmd
	var layers *goredis.MapStringStringCmd
	_, err := s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		counter = p.Get(ctx, policyCounterKey)
		layers = p.HGetAll(ctx, policyLayersKey)
		return nil
	})
	if err != nil && err != goredis.Nil {
		return nil, 0, queue.Unavailable(err)
	}
	change, err := changeOf(counter)
	if err != nil {
		return nil, 0, err
	}
	all := make(map[string][]byte, len(layers.Val()))
	for tenant, l := range layers.Val() {
		all[tenant] = []byte(l)
	}
	return all, change, nil
}

// PolicyChanges is the tenants changed after since, each with its layer
// (nil: dropped) and the change that last touched it, and the change they
// are as of. A layer changed again while it is read is read as it is
// then, and again at the next call: taking a layer twice does no harm. A
// counter below since (Redis lost its data, or failed over to a replica
// that had not seen the last changes) is answered as it is: the caller
// reads them all again.
func (s *Store) PolicyChanges(ctx context.Context, since uint64) (map[string]queue.PolicyChange, uint64, error) {
	change, err := changeOf(s.rdb.Get(ctx, policyCounterKey))
	if err != nil || change == since {
		return nil, since, err
	}
	if change < since {
		return nil, change, nil
	}
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, policyChangesKey, &goredis.ZRangeBy{Min: "(" + strconv.FormatUint(since, 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, since, queue.Unavailable(err)
	}
	out := make(map[string]queue.PolicyChange, len(zs))
	if len(zs) == 0 {
		return out, change, nil
	}
	tenants := make([]string, len(zs))
	for i, z := range zs {
		tenants[i], _ = z.Member.(string)
	}
	layers, err := s.rdb.HMGet(ctx, policyLayersKey, tenants...).Result()
	if err != nil {
		return nil, since, queue.Unavailable(err)
	}
	for i, t := range tenants {
		c := queue.PolicyChange{Change: uint64(zs[i].Score)}
		if l, ok := layers[i].(string); ok {
			c.Layer = []byte(l)
		}
		out[t] = c
	}
	return out, change, nil
}

// changeOf reads the change counter (none yet: 0).
func changeOf(cmd *goredis.StringCmd) (uint64, error) {
	v, err := cmd.Uint64()
	switch {
	case err == goredis.Nil:
		return 0, nil
	case err != nil:
		return 0, queue.Unavailable(err)
	}
	return v, nil
}
