package bolt

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

func (s *Store) recover() error {
	now := s.clock.Now()
	return s.db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketJobs, bucketPayloads, bucketResponses, bucketWaiting, bucketDone, bucketFailed, bucketIdem, bucketTenants, bucketTenantLog, bucketMeta, bucketCallbacks, bucketCallbackDue} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if err := s.replayWAL(tx); err != nil {
			return err
		}
		if err := replayTenantLog(tx); err != nil {
			return err
		}
		if err := moveDueIndex(tx); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		clean := bytes.Equal(meta.Get(keyClean), []byte("1"))
		s.cleanStart = clean
		if err := meta.Delete(keyClean); err != nil {
			return err
		}
		return s.respace(tx, now, sentBy(tx, now), clean)
	})
}

// respace counts waiting jobs per tenant and, for a tenant whose jobs' times
// passed while the process was down, moves them: from the later of now and
// the last moment a send may have happened, plus one interval, one interval
// apart, in their original order. After an unclean stop, any job whose time
// passed may have been sent at that time.
func (s *Store) respace(tx *bbolt.Tx, now, sentBy time.Time, clean bool) error {
	byTenant, tenants, err := readWaiting(tx)
	if err != nil {
		return err
	}
	if !clean {
		s.countOpenAtCrash(byTenant, sentBy)
	}
	moved := 0
	for _, name := range tenants {
		tm, err := s.loadTenantTx(tx, name)
		if err != nil {
			return err
		}
		for _, w := range byTenant[name] {
			if w.job.State == queue.StateScheduled {
				tm.scheduled++
			} else {
				tm.depth++
			}
		}
		moved += respaceTenant(tm, byTenant[name], s.policy(name), now, sentBy, clean)
	}
	for _, name := range tenants {
		if err := s.scheduleWaiting(tx, name, byTenant[name], now); err != nil {
			return err
		}
	}
	for name, tm := range s.tenants {
		if err := putTenantRecord(tx, name, tm.rec); err != nil {
			return err
		}
	}
	if moved > 0 {
		s.log.Info("spaced out jobs whose time passed while stopped", "jobs", moved, "clean_stop", clean)
	}
	return nil
}

// moveDueIndex moves a file's index of waiting jobs by slot (bucketDue,
// written by earlier versions) to bucketWaiting.
func moveDueIndex(tx *bbolt.Tx) error {
	due := tx.Bucket(bucketDue)
	if due == nil {
		return nil
	}
	waiting := tx.Bucket(bucketWaiting)
	if err := due.ForEach(func(k, v []byte) error {
		_, id := parseDueKey(k)
		return waiting.Put([]byte(id), slices.Clone(v))
	}); err != nil {
		return err
	}
	return tx.DeleteBucket(bucketDue)
}

// waitingJob is a waiting job, read at open.
type waitingJob struct {
	slot  time.Time
	moved bool
	job   queue.Job
}

// readWaiting reads the waiting jobs: each tenant's in slot order (then
// id), and the tenants in the order of their earliest slot.
func readWaiting(tx *bbolt.Tx) (map[string][]*waitingJob, []string, error) {
	byTenant := map[string][]*waitingJob{}
	var tenants []string
	c := tx.Bucket(bucketWaiting).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		id, name := string(k), string(v)
		if _, ok := keyOf(id); !ok {
			return nil, nil, fmt.Errorf("job %q in the index of waiting jobs has an id this version cannot read", id)
		}
		if _, ok := byTenant[name]; !ok {
			tenants = append(tenants, name)
		}
		j, ok, err := getJob(tx, id, false)
		if err != nil || !ok {
			return nil, nil, fmt.Errorf("job %s in the index of waiting jobs but not stored (%v)", id, err)
		}
		byTenant[name] = append(byTenant[name], &waitingJob{slot: j.EffectiveSlot(), job: j})
	}
	for _, jobs := range byTenant {
		slices.SortFunc(jobs, func(a, b *waitingJob) int {
			return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.job.ID, b.job.ID))
		})
	}
	slices.SortStableFunc(tenants, func(a, b string) int { return byTenant[a][0].slot.Compare(byTenant[b][0].slot) })
	return byTenant, tenants, nil
}

// respaceTenant moves a tenant's overdue jobs by rules.Respace, as a
// restart at now finds them (the last process may have sent up to
// sentBy), and returns how many it moved.
func respaceTenant(tm *tenantMem, jobs []*waitingJob, p leaky.Policy, now, sentBy time.Time, clean bool) int {
	placed := make([]rules.Placed, len(jobs))
	for i, w := range jobs {
		placed[i] = rules.Placed{Slot: w.slot, Cost: w.job.Cost, ID: w.job.ID}
	}
	moved := rules.Respace(&tm.rec, placed, p, rules.RestartPickup(tm.rec, placed, now, sentBy, clean))
	for i, w := range jobs {
		w.slot, w.moved = placed[i].Slot, placed[i].Moved
	}
	return moved
}

// scheduleWaiting writes a tenant's moved jobs at their new slots and puts
// all its waiting jobs in the in-memory schedule.
func (s *Store) scheduleWaiting(tx *bbolt.Tx, name string, jobs []*waitingJob, now time.Time) error {
	pz := s.tenants[name].rec.Pause
	for _, w := range jobs {
		j := w.job
		if w.moved {
			j.Slot, j.DispatchAt = w.slot, rules.DispatchAt(pz, w.slot, now)
			if err := putJob(tx, j); err != nil {
				return err
			}
		}
		s.sched.add(entryOf(j, rules.RealAt(pz, w.slot)))
	}
	return nil
}

// replayWAL writes the log's records that the bbolt file lacks (admissions
// answered before a crash), before anything reads the file.
func (s *Store) replayWAL(tx *bbolt.Tx) error {
	recs, err := s.wal.readAfter(walApplied(tx))
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := applyOps(tx, r.body); err != nil {
			return fmt.Errorf("write-ahead log record %d: %w", r.seq, err)
		}
	}
	if len(recs) > 0 {
		s.log.Info("wrote the write-ahead log into the store", "records", len(recs))
	}
	return putWALApplied(tx, s.wal.seq)
}
