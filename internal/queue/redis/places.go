package redis

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Caps on attempts in flight (DESIGN.md 6e), across every process: an
// owner takes a capped job's places (places.lua) before it claims the
// job, holds them while the job is being sent, and gives them back once
// its outcome is recorded. A job refused a place waits in its owner's
// memory (owned.parked), in order, not claimed: it can still be
// cancelled or held, and it holds nothing of the dispatcher. A place
// left by a dead owner lapses: its attempt may still be open at the
// vendor for the downstream's timeout.

var (
	//go:embed places.lua
	placesLua    string
	placesScript = newScript("places.lua", placesLua, false)
)

// placeKeep is how often an owner moves the ends of the places it holds
// on; a place lapses placeKeep twice plus its downstream's timeout after
// its last move.
const placeKeep = time.Second

// placeKeys are the sets of a downstream's places and of one of its
// tenants': in the downstream's hash slot, with its gate.
func placeKeys(downstream, tenant string) (ds, t string) {
	tag := "throttler:{ds:" + downstream + "}:places"
	return tag, tag + ":tenant:" + tenant
}

// place is a job's places, as held.
type place struct {
	downstream, tenant string
	name               string // the member in both sets
	timeout            time.Duration
}

// placeAsk is one job asking for its places.
type placeAsk struct {
	e    *entry
	caps queue.Caps
}

// placeReply is places.lua's answer: per job, taken or not.
type placeReply []bool

func (p *placeReply) Decode(r *luascript.Reply) {
	for r.More() {
		*p = append(*p, r.Flag())
	}
}

// lapse is when a place of a downstream of timeout, taken or kept now,
// lapses.
func lapse(now time.Time, timeout time.Duration) int64 {
	return micros(now.Add(2*placeKeep + timeout))
}

// takePlaces asks for the places of jobs of one downstream, in order (a
// tenant refused once is refused its later jobs too), and returns the
// places taken, nil for each job refused. holder names the tenure that
// holds them; force takes them whatever the counts.
func (s *Store) takePlaces(ctx context.Context, downstream string, shared int, asks []placeAsk, holder string, force bool) ([]*place, error) {
	dsKey, _ := placeKeys(downstream, "")
	keys := []string{dsKey}
	index := map[string]int{}
	now := s.localNow()
	var timeout time.Duration
	args := []any{micros(now), 0, shared, flag(force)}
	for _, a := range asks {
		i, ok := index[a.e.tenant]
		if !ok {
			_, tk := placeKeys(downstream, a.e.tenant)
			keys = append(keys, tk)
			i = len(keys)
			index[a.e.tenant] = i
		}
		timeout = max(timeout, a.caps.Timeout)
		args = append(args, i, a.caps.Tenant, a.e.id+":"+holder)
	}
	args[1] = lapse(now, timeout)
	var r placeReply
	if err := placesScript.Run(ctx, s.rdb, keys, args, &r); err != nil {
		return nil, err
	}
	if len(r) != len(asks) {
		return nil, fmt.Errorf("places.lua: %d replies for %d jobs", len(r), len(asks))
	}
	out := make([]*place, len(asks))
	for i, a := range asks {
		if r[i] {
			out[i] = &place{downstream: downstream, tenant: a.e.tenant, name: args[6+3*i].(string), timeout: timeout}
		}
	}
	return out, nil
}

// unplace gives places back.
func (s *Store) unplace(ctx context.Context, ps []*place) error {
	if len(ps) == 0 {
		return nil
	}
	_, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, pl := range ps {
			ds, t := placeKeys(pl.downstream, pl.tenant)
			p.ZRem(ctx, ds, pl.name)
			p.ZRem(ctx, t, pl.name)
		}
		return nil
	})
	return err
}

// keepPlaces moves the ends of places still held on.
func (s *Store) keepPlaces(ctx context.Context, ps []*place) error {
	if len(ps) == 0 {
		return nil
	}
	now := s.localNow()
	_, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, pl := range ps {
			ds, t := placeKeys(pl.downstream, pl.tenant)
			z := goredis.Z{Score: float64(lapse(now, pl.timeout)), Member: pl.name}
			ttl := 2*placeKeep + pl.timeout + time.Millisecond
			for _, k := range []string{ds, t} {
				p.ZAddXX(ctx, k, z)
				p.PExpire(ctx, k, ttl)
			}
		}
		return nil
	})
	return err
}

// parkPoll is how often an owner with jobs refused a place asks again:
// a place another process gives back is not told here.
const parkPoll = 10 * time.Millisecond

// place takes the places of due's capped jobs and of those parked before
// (one round trip per downstream) and returns the jobs that may be
// claimed: the uncapped, and the capped that got their places. A tenant
// asks for no more places than its cap could give at once, its jobs in
// order, and the tenants of a downstream's cap take turns; the jobs
// refused are parked, their order kept. The claim loop's. expiring are
// the capped jobs looked at to be expired (entry.expiry): with no place,
// their claim may only expire them (expireOnly), so no cap holds them,
// as no pace does (paced).
func (o *owned) place(due []*entry) (ready, expiring []*entry) {
	byTenant := map[string][]*entry{}
	for _, e := range due {
		capped := o.s.caps(e.tenant).Capped()
		if e.expiry && capped {
			expiring = append(expiring, e)
			continue
		}
		if capped || len(o.parked[e.tenant]) > 0 {
			byTenant[e.tenant] = append(byTenant[e.tenant], e)
			continue
		}
		ready = append(ready, e)
	}
	for tenant, parked := range o.parked {
		byTenant[tenant] = append(parked, byTenant[tenant]...)
		delete(o.parked, tenant)
	}
	type group struct {
		shared int
		asks   [][]placeAsk // per tenant, in order
	}
	groups := map[string]*group{}
	var dsOrder []string
	for tenant, es := range byTenant {
		c := o.s.caps(tenant)
		if !c.Capped() { // a reload took its caps away
			ready = append(ready, es...)
			continue
		}
		g := groups[c.Downstream]
		if g == nil {
			g = &group{shared: c.Shared}
			groups[c.Downstream] = g
			dsOrder = append(dsOrder, c.Downstream)
		}
		limit := c.Tenant
		if limit == 0 {
			limit = c.Shared
		}
		ask := make([]placeAsk, 0, min(limit, len(es)))
		for _, e := range es[:min(limit, len(es))] {
			ask = append(ask, placeAsk{e: e, caps: c})
		}
		g.asks = append(g.asks, ask)
		if len(es) > limit {
			o.parked[tenant] = es[limit:]
		}
	}
	for _, ds := range dsOrder {
		g := groups[ds]
		var asks []placeAsk // tenants taking turns
		for round := 0; ; round++ {
			more := false
			for _, a := range g.asks {
				if round < len(a) {
					asks = append(asks, a[round])
					more = true
				}
			}
			if !more {
				break
			}
		}
		got, err := o.s.takePlaces(context.WithoutCancel(o.ctx), ds, g.shared, asks, o.fence.Token(), false)
		if err != nil {
			o.s.log.Warn("cannot take places under a cap on jobs in flight; asking again", "downstream", ds, "err", err)
			got = make([]*place, len(asks))
		}
		refused := map[string][]*entry{}
		o.mu.Lock()
		for i, a := range asks {
			if got[i] == nil {
				refused[a.e.tenant] = append(refused[a.e.tenant], a.e)
				continue
			}
			o.places[a.e.id] = got[i]
			ready = append(ready, a.e)
		}
		o.mu.Unlock()
		for tenant, es := range refused { // in front of those not asked for
			o.parked[tenant] = append(es, o.parked[tenant]...)
		}
	}
	return ready, expiring
}

// placeHanded takes the places of the jobs being sent that have none but
// whose tenant is capped now (a reload set a cap, or moved the tenant to a
// capped downstream): they are open at the vendor, so they are counted,
// over the cap if they are more, and the next claims wait for them. The
// claim loop's, after a reload.
func (o *owned) placeHanded() {
	asks := map[string][]placeAsk{}
	shared := map[string]int{}
	o.mu.Lock()
	for id, h := range o.handed {
		if _, ok := o.places[id]; ok {
			continue
		}
		if c := o.s.caps(h.tenant); c.Capped() {
			asks[c.Downstream] = append(asks[c.Downstream], placeAsk{e: &entry{id: id, tenant: h.tenant}, caps: c})
			shared[c.Downstream] = c.Shared
		}
	}
	o.mu.Unlock()
	for ds, a := range asks {
		got, err := o.s.takePlaces(context.WithoutCancel(o.ctx), ds, shared[ds], a, o.fence.Token(), true)
		if err != nil {
			o.s.log.Warn("cannot count the jobs being sent under a cap a reload set: the cap counts the attempts begun after it", "downstream", ds, "err", err)
			continue
		}
		var ended []*place
		o.mu.Lock()
		for i, ask := range a {
			if _, sending := o.handed[ask.e.id]; sending && got[i] != nil {
				o.places[ask.e.id] = got[i]
			} else if got[i] != nil {
				ended = append(ended, got[i]) // its outcome was recorded meanwhile
			}
		}
		o.mu.Unlock()
		if err := o.s.unplace(context.WithoutCancel(o.ctx), ended); err != nil {
			o.s.log.Warn("cannot give back places under a cap on jobs in flight: they lapse", "partition", o.fence.Partition, "err", err)
		}
	}
}

// unplace gives back the places of jobs ids (their outcomes are
// recorded, or they were not claimed), and wakes the claim loop for the
// jobs that wait for them.
func (o *owned) unplace(ids ...string) {
	var ps []*place
	o.mu.Lock()
	for _, id := range ids {
		if p, ok := o.places[id]; ok {
			ps = append(ps, p)
			delete(o.places, id)
		}
	}
	o.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	if err := o.s.unplace(context.WithoutCancel(o.ctx), ps); err != nil {
		o.s.log.Warn("cannot give back places under a cap on jobs in flight: they lapse", "partition", o.fence.Partition, "err", err)
	}
	o.poke()
}

// keepingPlaces moves the ends of the places held on every placeKeep, in
// a goroutine of its own (a claim loop held up by a slow round trip must
// not let them lapse), until the tenure's outcomes are all written.
func (o *owned) keepingPlaces() {
	clk := o.s.Clock() // the clock the places' ends are in
	for {
		select {
		case <-o.written:
			return
		case <-clk.After(placeKeep):
		}
		o.mu.Lock()
		ps := make([]*place, 0, len(o.places))
		for _, p := range o.places {
			ps = append(ps, p)
		}
		o.mu.Unlock()
		if err := o.s.keepPlaces(context.WithoutCancel(o.ctx), ps); err != nil {
			o.s.log.Warn("cannot keep the places held under a cap on jobs in flight: they lapse unless kept later", "partition", o.fence.Partition, "err", err)
		}
	}
}

func idsOf(es []*entry) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.id
	}
	return ids
}
