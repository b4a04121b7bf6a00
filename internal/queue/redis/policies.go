package redis

import (
	"context"
	_ "embed"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

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

// PutPolicy keeps tenant's policy layer.
func (s *Store) PutPolicy(ctx context.Context, tenant string, layer []byte) error {
	_, err := policiesScript.RunInt(ctx, s.rdb, []string{policyLayersKey, policyCounterKey, policyChangesKey}, []any{tenant, layer})
	return err
}

// DropPolicy forgets tenant's policy layer.
func (s *Store) DropPolicy(ctx context.Context, tenant string) (bool, error) {
	had, err := policiesScript.RunInt(ctx, s.rdb, []string{policyLayersKey, policyCounterKey, policyChangesKey}, []any{tenant, ""})
	return had == 1, err
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

// PolicyChanges is the layers changed after since (nil: dropped) and the
// change they are as of. A layer changed again while it is read is read
// as it is then, and again at the next call: taking a layer twice does no
// harm.
func (s *Store) PolicyChanges(ctx context.Context, since uint64) (map[string][]byte, uint64, error) {
	change, err := changeOf(s.rdb.Get(ctx, policyCounterKey))
	if err != nil || change <= since {
		return nil, since, err
	}
	tenants, err := s.rdb.ZRangeByScore(ctx, policyChangesKey, &goredis.ZRangeBy{Min: "(" + strconv.FormatUint(since, 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, since, queue.Unavailable(err)
	}
	out := make(map[string][]byte, len(tenants))
	if len(tenants) == 0 {
		return out, change, nil
	}
	layers, err := s.rdb.HMGet(ctx, policyLayersKey, tenants...).Result()
	if err != nil {
		return nil, since, queue.Unavailable(err)
	}
	for i, t := range tenants {
		if l, ok := layers[i].(string); ok {
			out[t] = []byte(l)
		} else {
			out[t] = nil
		}
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
