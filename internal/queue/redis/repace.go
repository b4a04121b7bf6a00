package redis

import (
	"container/heap"
	"context"
	_ "embed"
	"errors"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// What an owner does when policies change. At a reload (any tenant's):
// the entries held back for their tenants' pace go by the new tolerance
// (repaceHeld), and the claimed sets follow the new bounds (recount). At
// a change of one tenant's policy by the API: its backlog is placed anew
// (rules.Repace, repace.lua), by the owner of its partition, in whichever
// process that is, between two of its claims.

var (
	//go:embed repace.lua
	repaceLua    string
	repaceScript = newScript("repace.lua", owner.FenceLua+repaceLua, true)
)

// Repace asks the owner of tenant's partition, if this process has it, to
// place the tenant's waiting jobs anew by the policy in force now
// (queue.Repacer). Every process is told of a policy change (the API's
// process at once, the others within policies.Poll): the owner acts.
func (s *Store) Repace(_ context.Context, tenant string) error {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	for c := range s.consumers {
		c.mu.Lock()
		o := c.parts[s.partOf(tenant)]
		c.mu.Unlock()
		if o != nil {
			o.askRepace(tenant, true)
		}
	}
	return nil
}

// maxRepacedAhead bounds owned.repaced.
const maxRepacedAhead = 100_000

// askRepace has tenant's backlog placed anew before the next claim (at
// once, if wake).
func (o *owned) askRepace(tenant string, wake bool) {
	o.mu.Lock()
	if o.repaceDue == nil {
		o.repaceDue = map[string]bool{}
	}
	o.repaceDue[tenant] = true
	o.mu.Unlock()
	if wake {
		o.poke()
	}
}

// repaceMoved is repace.lua's answer: the jobs moved.
type repaceMoved struct {
	now   time.Time
	moved []movedJob
}

type movedJob struct {
	id             string
	slot, dispatch time.Time
}

func (r *repaceMoved) Decode(rep *luascript.Reply) {
	r.now = rep.Time()
	for rep.More() {
		r.moved = append(r.moved, movedJob{id: rep.Str(), slot: rep.Time(), dispatch: rep.Time()})
	}
}

// repace places the backlogs asked for anew (repace.lua) and moves their
// entries to their new times. A tenant that cannot be done now is tried
// again at the claim loop's next turn (which backs off while Redis is
// away); one whose lease is gone is not.
func (o *owned) repace() {
	o.mu.Lock()
	due := o.repaceDue
	o.repaceDue = nil
	o.mu.Unlock()
	for tenant := range due {
		moved, err := o.repaceTenant(tenant)
		if err != nil {
			if !errors.Is(err, owner.ErrFenced) {
				o.s.log.Warn("cannot re-pace a tenant's backlog for its new policy; trying again", "partition", o.fence.Partition, "tenant", tenant, "err", err)
				o.askRepace(tenant, false)
			}
			continue
		}
		if len(moved) == 0 {
			continue
		}
		at := make(map[string]time.Time, len(moved))
		first := moved[0].dispatch
		for _, m := range moved {
			at[m.id] = m.dispatch
			first = clock.Earliest(first, m.dispatch)
		}
		o.mu.Lock()
		// The claims' pace, read ahead of the gate, was the old policy's:
		// the first job moved may go at its new time (the gate still
		// spaces the write from the send before).
		if pace := first.Add(o.s.policy(tenant).Tolerance()); o.pace[tenant].After(pace) {
			o.pace[tenant] = pace
		}
		for _, e := range o.sched {
			if d, ok := at[e.id]; ok && !e.expiry && !e.held {
				e.at, e.place, e.paced = d, d, false
			}
		}
		heap.Init(&o.sched)
		// A job admitted before the repace whose arrival this owner has
		// not read yet: its line has its old time (arrive).
		for id, d := range at {
			if !o.known[id] {
				if o.repaced == nil || len(o.repaced) >= maxRepacedAhead {
					// Anew: what is left are jobs cancelled before their
					// arrival was read.
					o.repaced = map[string]time.Time{}
				}
				o.repaced[id] = d
			}
		}
		o.mu.Unlock()
	}
}

func (o *owned) repaceTenant(tenant string) ([]movedJob, error) {
	p := o.s.policy(tenant)
	var handedEnd time.Time // tenant time: the jobs handed over keep their places
	var handed []rules.Placed
	o.mu.Lock()
	for id, h := range o.handed {
		if h.tenant == tenant && !h.slot.IsZero() {
			if end := h.slot.Add(time.Duration(h.cost) * p.Interval); end.After(handedEnd) {
				handedEnd = end
			}
			handed = append(handed, rules.Placed{Slot: h.slot, Cost: h.cost, ID: id})
		}
	}
	o.mu.Unlock()
	args := repaceArgs(o.fence, o.s.now(), o.k, tenant, p, handedEnd, handed, o.s.idle)
	var r repaceMoved
	err := o.fence.Err(repaceScript.Run(context.WithoutCancel(o.ctx), o.s.rdb, o.fence.Keys(), args, &r))
	return r.moved, err
}

// repaceArgs is ARGV of a run of repace.lua under fence f at now
// (microseconds, 0: Redis's TIME); handed is the tenant's jobs handed over
// and not recorded (slot, tenant time, and cost), which end at handedEnd.
func repaceArgs(f owner.Fence, now int64, k partKeys, tenant string, p leaky.Policy, handedEnd time.Time, handed []rules.Placed, idle time.Duration) []any {
	args := []any{f.Token(), now, k.tag, tenant, usCeil(p.Interval), usCeil(p.Tolerance()), p.Capacity, microsOf(handedEnd), idle.Milliseconds(), len(p.Windows)}
	for _, w := range p.Windows {
		args = append(args, w.String(), w.N, usCeil(w.Length))
	}
	args = append(args, len(handed))
	for _, h := range handed {
		args = append(args, micros(h.Slot), max(h.Cost, 1))
	}
	return args
}

// repaceHeld brings the entries held back for their tenants' pace to that
// pace by the policies in force now (Store.PoliciesChanged): the pace
// itself stands (the gate keeps each send's step at the interval it went
// at), the tolerance is the new policy's.
func (o *owned) repaceHeld() {
	o.recountDue.Store(true)
	o.mu.Lock()
	o.sched.repace(func(tenant string) time.Time {
		return o.pace[tenant].Add(-o.s.policy(tenant).Tolerance())
	})
	o.mu.Unlock()
	o.poke()
}

// recount brings the claimed sets of the tenants this owner is sending
// to to the policies in force now (recount.lua), between two claims: the
// claims and outcomes keep a tenant's set only where its admission counts
// the jobs being sent by slot (rules.CountsWaiting), and a reload may
// change that while its jobs are in flight. A job that ended before the
// reload with its slot still ahead (a lead at most) is not put back.
func (o *owned) recount() {
	by := map[string][]any{}
	o.mu.Lock()
	for id, h := range o.handed {
		by[h.tenant] = append(by[h.tenant], micros(h.slot), id)
	}
	o.mu.Unlock()
	if len(by) == 0 {
		return
	}
	args := []any{o.k.tag}
	for tenant, jobs := range by {
		if !rules.CountsWaiting(o.s.policy(tenant)) {
			jobs = nil
			args = append(args, tenant, "0", 0)
		} else {
			args = append(args, tenant, "1", len(jobs)/2)
		}
		args = append(args, jobs...)
	}
	err := o.fence.Err(recountScript.Run(context.WithoutCancel(o.ctx), o.s.rdb, o.fence.Keys(), o.fence.Args(args...), nil))
	if err != nil && !errors.Is(err, owner.ErrFenced) {
		o.s.log.Warn("cannot bring the jobs being sent to the policies reloaded; trying again before the next claim", "partition", o.fence.Partition, "err", err)
		o.recountDue.Store(true)
	}
}
