// Package policies owns tenants' policies as the API sets them (DESIGN.md
// 6f): kept in the store (queue.Policies), put in force in the live
// config's API layer (config.SetPolicy), and, on a store many processes
// share, followed every Poll from what the other processes set.
package policies

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/startstop"
)

// Poll is how often a process asks a shared store which policies changed:
// a change is in force in every process within this and a read.
const Poll = 250 * time.Millisecond

// Options configure a Keeper.
type Options struct {
	Store queue.Policies
	// Live is the config in force (a reload swaps it; Adopt carries the
	// policies over).
	Live func() *config.Config
	// Changed is told the tenants whose policies in force changed (nil:
	// any tenant's, a reload). Optional.
	Changed func(tenants []string)
	// Counted counts a change made here: "set" or "drop". Optional.
	Counted func(change string)
	Logger  *slog.Logger
}

// Keeper sets, drops and follows tenants' policies. Its methods are safe
// for concurrent use; changes and reloads (Adopt) go one at a time.
type Keeper struct {
	opts  Options
	mu    sync.Mutex
	since uint64 // the store's last change taken
	// mine are the changes this process made, by tenant: when one comes
	// back from the store it is in force here already (taking it again
	// would place the tenant's backlog anew from a later now).
	mine map[string]uint64
	// refused are the layers other processes set that this process's
	// config refuses (a plan its file lacks), by tenant: taken at the
	// reload that makes them hold.
	refused  map[string][]byte
	follower *startstop.Periodic // nil: not followed
}

// New is a Keeper; Start reads what the store keeps.
func New(opts Options) *Keeper {
	if opts.Changed == nil {
		opts.Changed = func([]string) {}
	}
	if opts.Counted == nil {
		opts.Counted = func(string) {}
	}
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	return &Keeper{opts: opts, mine: map[string]uint64{}, refused: map[string][]byte{}}
}

// Load puts stored policies in force in cfg. A policy cfg refuses (a plan
// its file no longer has) refuses the load: serving the tenant by another
// policy than the one set would be a change nobody asked for.
func Load(cfg *config.Config, stored map[string][]byte) error {
	for _, tenant := range slices.Sorted(maps.Keys(stored)) {
		if err := set(cfg, tenant, stored[tenant]); err != nil {
			return fmt.Errorf("tenant %q's policy, kept in the store, does not hold with this config: %w; give the file what it needs, or drop the policy from a running process (throttler tenant reset %s)", tenant, err, tenant)
		}
	}
	return nil
}

// set puts a stored layer in force in cfg.
func set(cfg *config.Config, tenant string, raw []byte) error {
	layer, err := config.ParsePolicyLayer(raw)
	if err == nil {
		_, err = cfg.SetPolicy(tenant, layer)
	}
	return err
}

// Start reads the policies a shared store keeps and follows their changes
// until Stop. The embedded store gives its own at its open, before it
// recovers (bolt.Options.PoliciesRead with Load): there is nothing to read
// or follow here.
func (k *Keeper) Start(ctx context.Context) error {
	shared, ok := k.opts.Store.(queue.PolicyChanges)
	if !ok {
		return nil
	}
	all, since, err := k.opts.Store.AllPolicies(ctx)
	if err != nil {
		return fmt.Errorf("reading tenants' policies from the store: %w", err)
	}
	if err := Load(k.opts.Live(), all); err != nil {
		return err
	}
	k.since = since
	k.follow(shared)
	return nil
}

// Stop stops following changes.
func (k *Keeper) Stop() {
	if k.follower != nil {
		k.follower.Stop()
	}
}

// follow takes, every Poll, the policies other processes set.
func (k *Keeper) follow(shared queue.PolicyChanges) {
	k.follower = &startstop.Periodic{Name: "policy follower", Every: Poll, Run: func(ctx context.Context) {
		if err := k.poll(ctx, shared); err != nil && ctx.Err() == nil {
			k.opts.Logger.Warn("cannot read tenants' policy changes from the store; retrying", "err", err)
		}
	}}
	k.follower.Start(context.Background())
}

// poll takes what changed since the last poll; all of it again when the
// store's count of changes went back.
func (k *Keeper) poll(ctx context.Context, shared queue.PolicyChanges) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	changed, since, err := shared.PolicyChanges(ctx, k.since)
	if err != nil {
		return err
	}
	if since < k.since {
		return k.resync(ctx)
	}
	k.take(changed)
	k.since = since
	return nil
}

// resync makes the policies in force the store's, all of them: it lost
// changes this process took (its data, or a failover to a replica behind).
func (k *Keeper) resync(ctx context.Context) error {
	all, since, err := k.opts.Store.AllPolicies(ctx)
	if err != nil {
		return err
	}
	k.opts.Logger.Warn("the store's count of policy changes went back (it lost data, or failed over): taking every tenant's policy from it again", "was", k.since, "now", since, "policies", len(all))
	changed := map[string]queue.PolicyChange{}
	for tenant := range k.opts.Live().PolicyLayers() {
		changed[tenant] = queue.PolicyChange{} // dropped, unless the store has it
	}
	for tenant, raw := range all {
		changed[tenant] = queue.PolicyChange{Layer: raw}
	}
	clear(k.mine)
	k.take(changed)
	k.since = since
	return nil
}

// take puts policies another process set in force here. One this
// process's config refuses is logged and kept aside (refused): the tenant
// keeps what it had until a reload makes it hold. k.mu held.
func (k *Keeper) take(changed map[string]queue.PolicyChange) {
	cfg := k.opts.Live()
	var tenants []string
	for _, tenant := range slices.Sorted(maps.Keys(changed)) {
		c := changed[tenant]
		if mine, ok := k.mine[tenant]; ok {
			delete(k.mine, tenant)
			if c.Change != 0 && mine >= c.Change {
				continue // this process's own change: in force already
			}
		}
		delete(k.refused, tenant)
		if c.Layer == nil {
			if cfg.DropPolicy(tenant) {
				tenants = append(tenants, tenant)
			}
			continue
		}
		if err := set(cfg, tenant, c.Layer); err != nil {
			k.refused[tenant] = c.Layer
			k.opts.Logger.Error("a tenant's policy set through another process does not hold with this process's config: the tenant keeps its policy here until a reload makes it hold", "tenant", tenant, "err", err)
			continue
		}
		tenants = append(tenants, tenant)
	}
	if len(tenants) > 0 {
		k.opts.Changed(tenants)
	}
}

// SetPolicy checks layer against the live config, keeps it in the store,
// then puts it in force (api.PolicyEditor). A refusal is a *config.Error
// naming the key; nothing changes.
func (k *Keeper) SetPolicy(ctx context.Context, tenant string, layer config.PolicyLayer) (config.Policy, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cfg := k.opts.Live()
	if err := cfg.CheckPolicy(tenant, layer); err != nil {
		return config.Policy{}, err
	}
	raw, err := json.Marshal(layer)
	if err != nil {
		return config.Policy{}, err
	}
	change, err := k.opts.Store.PutPolicy(ctx, tenant, raw)
	if err != nil {
		return config.Policy{}, err
	}
	if change > 0 {
		k.mine[tenant] = change
	}
	delete(k.refused, tenant)
	if _, err := cfg.SetPolicy(tenant, layer); err != nil {
		return config.Policy{}, err // checked above
	}
	k.opts.Changed([]string{tenant})
	k.opts.Counted("set")
	return cfg.PolicyOf(tenant), nil
}

// DropPolicy drops tenant's API layer, back to the file's policy
// (api.PolicyEditor); false if it had none.
func (k *Keeper) DropPolicy(ctx context.Context, tenant string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	had, change, err := k.opts.Store.DropPolicy(ctx, tenant)
	if err != nil {
		return false, err
	}
	if change > 0 {
		k.mine[tenant] = change
	}
	delete(k.refused, tenant)
	if k.opts.Live().DropPolicy(tenant) || had {
		k.opts.Changed([]string{tenant})
		k.opts.Counted("drop")
	}
	return had, nil
}

// Adopt carries the policies in force in cur over to next (a reload) and
// runs swap, one with the changes: none is lost between the two. An error
// (a policy next's file refuses) leaves cur in force. The policies other
// processes set that cur's file refused are taken where next's holds them.
func (k *Keeper) Adopt(next, cur *config.Config, swap func()) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := next.AdoptPolicies(cur); err != nil {
		return err
	}
	var taken []string
	for _, tenant := range slices.Sorted(maps.Keys(k.refused)) {
		if set(next, tenant, k.refused[tenant]) == nil {
			delete(k.refused, tenant)
			taken = append(taken, tenant)
		}
	}
	swap()
	k.opts.Changed(nil)
	if len(taken) > 0 {
		k.opts.Logger.Info("tenants' policies set through other processes hold with the reloaded config: taken", "tenants", taken)
		k.opts.Changed(taken)
	}
	return nil
}
