package bolt

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"throttler/internal/clock"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

func (s *Store) recover() error {
	now := s.clock.Now()
	return s.db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketJobs, bucketPayloads, bucketDue, bucketDone, bucketFailed, bucketIdem, bucketTenants, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		clean := bytes.Equal(meta.Get(keyClean), []byte("1"))
		s.cleanStart = clean
		if err := meta.Delete(keyClean); err != nil {
			return err
		}
		return s.respace(tx, now, clean)
	})
}

// respace counts waiting jobs per tenant and, for a tenant whose jobs' times
// passed while the process was down, moves them: from the later of now and
// the last moment a send may have happened, plus one interval, one interval
// apart, in their original order. After an unclean stop, any job whose time
// passed may have been sent at that time.
func (s *Store) respace(tx *bbolt.Tx, now time.Time, clean bool) error {
	type waiting struct {
		key    []byte
		slot   time.Time
		id     string
		moved  bool
		tenant string
		job    queue.Job
	}
	due := tx.Bucket(bucketDue)
	byTenant := map[string][]*waiting{} // in slot order, as the index is
	var tenants []string
	c := due.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		slot, id := parseDueKey(k)
		name := string(v)
		if _, ok := byTenant[name]; !ok {
			tenants = append(tenants, name)
		}
		j, ok, err := getJob(tx, id, false)
		if err != nil || !ok {
			return fmt.Errorf("job %s in the due index but not stored (%v)", id, err)
		}
		byTenant[name] = append(byTenant[name], &waiting{key: slices.Clone(k), slot: slot, id: id, tenant: name, job: j})
	}
	moved := 0
	for _, name := range tenants {
		jobs := byTenant[name]
		tm, err := s.loadTenantTx(tx, name)
		if err != nil {
			return err
		}
		tm.depth += len(jobs)
		pz := tm.rec.Pause
		if !pz.Held.IsZero() {
			continue // held: nothing goes until an operator resumes it
		}
		p := s.policy(name)
		floor := now
		if !tm.rec.LastAttemptAt.IsZero() {
			floor = clock.Later(floor, tm.rec.LastAttemptAt.Add(p.Interval))
		}
		if at, _ := pz.Real(jobs[0].slot); !at.After(now) && !clean {
			// One of them may have been written at any moment before the
			// crash (its time, or later: a slow connection, a held gate):
			// only "before now" is sure.
			floor = clock.Later(floor, now.Add(p.Interval))
		}
		recent := tm.rec.Recent(p)
		for _, w := range jobs {
			if at, _ := pz.Real(w.slot); !at.Before(floor) {
				break // on schedule: so are the later ones
			}
			// Real(floor - Shift) is floor: floor is past the pause's end.
			// The old slot stays in the windows' bookkeeping: it may have
			// been sent.
			cost := w.job.EffectiveCost()
			w.slot, w.moved = leaky.WindowSlot(recent, p, floor.Add(-pz.Shift), cost), true
			recent = leaky.Record(recent, p, w.slot, cost)
			floor = w.slot.Add(pz.Shift).Add(time.Duration(cost) * p.Interval)
			if next := w.slot.Add(time.Duration(cost) * p.Interval); tm.rec.TAT.Before(next) {
				tm.rec.TAT = next
			}
			moved++
		}
		tm.rec.SetRecent(p, recent)
	}
	for _, name := range tenants {
		pz := s.tenants[name].rec.Pause
		for _, w := range byTenant[name] {
			j := w.job
			if w.moved {
				j.Slot, j.DispatchAt = w.slot, queue.DispatchAt(pz, w.slot, now)
				if err := putJob(tx, j); err != nil {
					return err
				}
				if err := due.Delete(w.key); err != nil {
					return err
				}
				if err := due.Put(dueKey(w.slot, w.id), []byte(name)); err != nil {
					return err
				}
			}
			s.sched.add(entryOf(j, queue.RealAt(pz, w.slot)))
		}
	}
	for name, tm := range s.tenants {
		if err := putJSON(tx.Bucket(bucketTenants), []byte(name), tm.rec); err != nil {
			return err
		}
	}
	if moved > 0 {
		s.log.Info("spaced out jobs whose time passed while stopped", "jobs", moved, "clean_stop", clean)
	}
	return nil
}
