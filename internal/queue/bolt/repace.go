package bolt

import (
	"cmp"
	"context"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// Repace places tenant's waiting jobs anew by the policy in force now
// (rules.Repace; queue.Repacer): the jobs not handed over yet, after those
// that are. The new slots hold in memory at once; they are written with
// the tenant's record in one transaction. Should that write fail, the
// jobs go at their new slots all the same, and a restart before the next
// write of them finds their old ones: a faster policy's jobs then go later
// than promised; a slower one's as early as the old policy placed them,
// spaced by the gate at the new policy's rate.
func (s *Store) Repace(_ context.Context, tenant string) error {
	s.mu.Lock()
	tm, err := s.loadTenant(tenant)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	p, now := s.policy(tenant), s.clock.Now()
	var entries []dueEntry // those booked for their not_before stay, and the others go around them
	s.sched.tenantEntries(tenant, func(e dueEntry) { entries = append(entries, e) })
	slices.SortFunc(entries, func(a, b dueEntry) int { return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.id, b.id)) })
	var after time.Time // the jobs handed over keep their places
	var handed []rules.Placed
	for _, j := range s.claims {
		if j.Tenant == tenant && !j.Slot.IsZero() {
			if end := rules.RealAt(tm.rec.Pause, j.EffectiveSlot()).Add(time.Duration(j.EffectiveCost()) * p.Interval); end.After(after) {
				after = end
			}
			handed = append(handed, rules.Placed{Slot: j.EffectiveSlot(), Cost: j.Cost, ID: j.ID})
		}
	}
	notBefore, err := s.notBefores(entries)
	if err != nil {
		s.mu.Unlock()
		return queue.Unavailable(err)
	}
	placed := make([]rules.Placed, len(entries))
	for i, e := range entries {
		placed[i] = rules.Placed{Slot: e.slot, Cost: e.cost, ID: e.id, NotBefore: notBefore[e.id], Scheduled: e.scheduled}
	}
	if rules.Repace(&tm.rec, placed, p, now, after, handed) == 0 {
		tm.dirty = true // its schedule may have moved all the same (no credit)
		s.mu.Unlock()
		return nil
	}
	moved := map[string]time.Time{}
	for i, w := range placed {
		if w.Moved {
			e := entries[i]
			s.sched.remove(e.tenant, e.slot, e.id)
			e.slot, e.at = w.Slot, rules.RealAt(tm.rec.Pause, w.Slot)
			s.sched.add(e)
			moved[e.id] = w.Slot
		}
	}
	pz := tm.rec.Pause
	tm.pending++
	s.mu.Unlock()
	s.poke()

	err = s.commit(func(tx *bbolt.Tx) error {
		for id, slot := range moved {
			j, found, err := getJob(tx, id, false)
			if err != nil {
				return err
			}
			if !found || !j.State.Waiting() {
				continue // sent or ended meanwhile: its slot is history
			}
			j.Slot, j.DispatchAt = slot, rules.DispatchAt(pz, slot, now)
			if err := putJob(tx, j); err != nil {
				return err
			}
		}
		return s.putTenant(tx, tenant)
	})
	s.mu.Lock()
	tm.pending--
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("a tenant's backlog was re-paced for its new policy, but its new slots could not be written: they hold until a restart, which would send the jobs at their old ones", "tenant", tenant, "jobs", len(moved), "err", err)
		return queue.Unavailable(err)
	}
	return nil
}

// notBefores reads the not_before of the entries that have one, from the
// log or the file (s.mu held: it may open a read transaction).
func (s *Store) notBefores(entries []dueEntry) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	var stored []string
	for _, e := range entries {
		if !e.notBefore || e.scheduled {
			continue
		}
		if j, ok := s.loggedJob(e.id); ok {
			out[e.id] = j.NotBefore
		} else {
			stored = append(stored, e.id)
		}
	}
	if len(stored) == 0 {
		return out, nil
	}
	err := s.db.View(func(tx *bbolt.Tx) error {
		for _, id := range stored {
			j, found, err := getJob(tx, id, false)
			if err != nil {
				return err
			}
			if found {
				out[id] = j.NotBefore
			}
		}
		return nil
	})
	return out, err
}
