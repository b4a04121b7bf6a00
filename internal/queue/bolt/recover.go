package bolt

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

func (s *Store) recover() error {
	now := s.clock.Now()
	s.chooseFreelistSync()
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
// passed may have been sent at that time. The moved jobs' records are
// written after the open (writeRespaced): the schedule has their new slots.
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
			if w.scheduled {
				tm.scheduled++
			} else {
				tm.depth++
			}
		}
		moved += s.respaceTenant(tm, byTenant[name], s.policy(name), now, sentBy, clean)
		s.scheduleWaiting(name, byTenant[name])
		delete(byTenant, name) // its memory goes as the next tenant's comes
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

// waitingJob is a waiting job as a restart reads it: its place, in a
// value without pointers (times in Unix nanoseconds), so that a restart
// holds a few dozen bytes per job, not the job.
type waitingJob struct {
	slot, dispatchAt, deadline int64
	key                        jobKey
	cost                       int32
	scheduled, notBefore       bool
	// placeInRecord: its value in the index is an earlier version's, and
	// its place was read from its record (writeRespaced writes it anew).
	placeInRecord bool
}

// readWaiting reads the waiting jobs from the index of waiting jobs (a
// job's record only where an earlier version wrote its value there): each
// tenant's in slot order (then id), and the tenants in the order of their
// earliest slot.
func readWaiting(tx *bbolt.Tx) (map[string][]waitingJob, []string, error) {
	index := map[string]int{}
	var lists [][]waitingJob
	var tenants []string
	records := recordWalk{c: tx.Bucket(bucketJobs).Cursor()}
	c := tx.Bucket(bucketWaiting).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		key, ok := keyOf(string(k))
		if !ok {
			return nil, nil, fmt.Errorf("job %q in the index of waiting jobs has an id this version cannot read", k)
		}
		f, current, err := decodeWaitingValue(v)
		if err == nil && !current {
			f, err = records.place(k)
			if err == nil && string(f.tenant) != string(v) {
				err = fmt.Errorf("its record is of tenant %q, the index says %q", f.tenant, v)
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("job %s in the index of waiting jobs: %w", k, err)
		}
		w := waitingJob{slot: nanos(f.slot), dispatchAt: nanos(f.dispatchAt), deadline: noDeadline, key: key,
			cost: int32(min(f.cost, math.MaxInt32)), scheduled: f.state == queue.StateScheduled, notBefore: !f.notBefore.IsZero(),
			placeInRecord: !current}
		if !f.deadline.IsZero() {
			w.deadline = nanos(f.deadline)
		}
		i, known := index[string(f.tenant)] // no copy of the name to look it up
		if !known {
			i = len(lists)
			index[string(f.tenant)] = i
			tenants = append(tenants, string(f.tenant))
			lists = append(lists, nil)
		}
		lists[i] = append(lists[i], w)
	}
	byTenant := make(map[string][]waitingJob, len(tenants))
	for i, name := range tenants {
		jobs := lists[i]
		// Admitted in slot order, most often: the index is by id, by time.
		if !slices.IsSortedFunc(jobs, byPlace) {
			slices.SortFunc(jobs, byPlace)
		}
		byTenant[name] = jobs
	}
	slices.SortStableFunc(tenants, func(a, b string) int { return cmp.Compare(byTenant[a][0].slot, byTenant[b][0].slot) })
	return byTenant, tenants, nil
}

// byPlace orders a tenant's waiting jobs by slot, then id.
func byPlace(a, b waitingJob) int {
	if a.slot != b.slot { // cmp.Or would compare the ids every time
		return cmp.Compare(a.slot, b.slot)
	}
	return bytes.Compare(a.key[:], b.key[:])
}

// recordWalk reads waiting jobs' records in id order, walking along the
// jobs bucket (also by id) instead of looking each up.
type recordWalk struct {
	c       *bbolt.Cursor
	k, v    []byte
	started bool
}

// place reads the place of job k from its record (k after the last asked).
func (r *recordWalk) place(k []byte) (waitingFields, error) {
	if !r.started {
		r.k, r.v = r.c.Seek(k)
		r.started = true
	}
	for step := 0; r.k != nil && bytes.Compare(r.k, k) < 0; step++ {
		if step == 8 { // a run of finished jobs: jump over it
			r.k, r.v = r.c.Seek(k)
			break
		}
		r.k, r.v = r.c.Next()
	}
	if !bytes.Equal(r.k, k) {
		return waitingFields{}, errors.New("not stored")
	}
	return decodeWaiting(r.v)
}

// respaceTenant moves a tenant's overdue jobs by rules.Respace, as a
// restart at now finds them (the last process may have sent up to
// sentBy), keeps the moves for writeRespaced (with the jobs whose place
// was read from their records), and returns how many it moved.
func (s *Store) respaceTenant(tm *tenantMem, jobs []waitingJob, p leaky.Policy, now, sentBy time.Time, clean bool) int {
	placed := make([]rules.Placed, len(jobs))
	booked := len(tm.rec.Booked) > 0 // only bookings are found by id
	for i, w := range jobs {
		placed[i] = rules.Placed{Slot: fromNanos(w.slot), Cost: int(w.cost)}
		if booked {
			placed[i].ID = w.key.String()
		}
	}
	moved := rules.Respace(&tm.rec, placed, p, rules.RestartPickup(tm.rec, placed, now, sentBy, clean))
	written := make([]respacedSlot, 0, moved)
	for i := range jobs {
		w := &jobs[i]
		switch {
		case placed[i].Moved:
			to := nanos(placed[i].Slot)
			written = append(written, respacedSlot{key: w.key, from: w.slot, to: to,
				at: nanos(rules.DispatchAt(tm.rec.Pause, placed[i].Slot, now))})
			w.slot = to
		case w.placeInRecord:
			written = append(written, respacedSlot{key: w.key, from: w.slot, to: w.slot, at: w.dispatchAt})
		}
	}
	if len(written) > 0 {
		s.respaced = append(s.respaced, written)
	}
	return moved
}

// scheduleWaiting puts a tenant's waiting jobs in the in-memory schedule.
func (s *Store) scheduleWaiting(name string, jobs []waitingJob) {
	pz := s.tenants[name].rec.Pause
	line := make([]slimEntry, len(jobs))
	for i, w := range jobs {
		e := slimEntry{at: nanos(rules.RealAt(pz, fromNanos(w.slot))), slot: w.slot, deadline: w.deadline, id: w.key, cost: max(w.cost, 1)}
		if w.scheduled {
			e.flags |= flagScheduled
		}
		if w.notBefore {
			e.flags |= flagNotBefore
		}
		line[i] = e
	}
	s.sched.fill(name, line)
}

// respacedSlot is a job a restart moved, to be written (writeRespaced):
// from its record's slot to the schedule's, with its dispatch time.
type respacedSlot struct {
	key          jobKey
	from, to, at int64
}

// respacedBatch is how many moved jobs one commit of writeRespaced writes:
// a few milliseconds of the committer, which admissions wait behind.
const respacedBatch = 1000

// writeRespaced writes the records of the jobs the restart moved, and the
// index values of those an earlier version wrote (putJob writes both), a
// batch per commit, after the store opened: a restart's time and memory do
// not grow with the backlog it moves. Until then a record has the slot it had
// before the restart, which only a crash before the write would read: the
// next restart places the job again from there, as this one did. A record
// whose slot changed meanwhile (a re-pacing) or that no longer waits is
// left as it is. It returns when all are written or the store closes.
func (s *Store) writeRespaced() {
	defer close(s.respacedDone)
	for len(s.respaced) > 0 && !s.isClosing() {
		// A tenant's moves, up to a batch of them.
		batch := s.respaced[0][:min(respacedBatch, len(s.respaced[0]))]
		err := s.commit(func(tx *bbolt.Tx) error {
			for _, m := range batch {
				j, found, err := getJob(tx, m.key.String(), false)
				if err != nil {
					return err
				}
				if !found || !j.State.Waiting() || nanos(j.EffectiveSlot()) != m.from {
					continue
				}
				j.Slot, j.DispatchAt = fromNanos(m.to), fromNanos(m.at)
				if err := putJob(tx, j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if s.isClosing() {
				return
			}
			s.log.Warn("cannot write the slots of jobs a restart moved; trying again", "err", err)
			select {
			case <-s.stop:
			case <-time.After(time.Second):
			}
			continue
		}
		if s.respaced[0] = s.respaced[0][len(batch):]; len(s.respaced[0]) == 0 {
			s.respaced[0] = nil
			s.respaced = s.respaced[1:]
		}
	}
	s.respaced = nil
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
