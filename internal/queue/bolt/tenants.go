package bolt

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

type tenantMem struct {
	rec   rules.Record
	depth int
	// scheduled counts the jobs booked for their not_before (not in depth).
	scheduled int
	inFlight  int
	// pending counts Enqueue calls holding this tenant between decision and
	// commit: the tenant must not be evicted meanwhile.
	pending int
	// unsettled are the slots of jobs admitted by those calls, not yet in
	// the schedule: with windows they wait like the scheduled ones.
	unsettled []time.Time
	// arrived is the latest arrival (now plus the start lag, tenant time)
	// its admissions were decided from: the next ones are no earlier.
	arrived time.Time
	dirty   bool
}

// leave counts one of the tenant's waiting jobs out: of its scheduled
// jobs, or of its depth.
func (tm *tenantMem) leave(scheduled bool) {
	if scheduled {
		tm.scheduled--
	} else {
		tm.depth--
	}
}

// loadTenantTx returns the in-memory tenant, reading it from tx if needed.
// Callers hold s.mu or run before the store is shared.
func (s *Store) loadTenantTx(tx *bbolt.Tx, name string) (*tenantMem, error) {
	if tm, ok := s.tenants[name]; ok {
		return tm, nil
	}
	tm := &tenantMem{}
	if raw := tx.Bucket(bucketTenants).Get([]byte(name)); raw != nil {
		rec, err := decodeTenant(raw)
		if err != nil {
			return nil, fmt.Errorf("tenant %q: %w", name, err)
		}
		tm.rec = rec
	}
	if err := dropStaleBookings(tx, &tm.rec); err != nil {
		return nil, fmt.Errorf("tenant %q: %w", name, err)
	}
	tm.rec.FloorAfterLastAttempt(s.policy(name), s.opened)
	s.tenants[name] = tm
	return tm, nil
}

// dropStaleBookings drops the bookings of jobs cancelled or expired: a
// cancel or an expiry drops its job's booking from the record in memory,
// which a crash can lose before the record is next written.
func dropStaleBookings(tx *bbolt.Tx, rec *rules.Record) error {
	for _, b := range rec.Booked {
		j, found, err := getJob(tx, b.Job, false)
		if err != nil {
			return err
		}
		if found && (j.State == queue.StateCancelled || j.State == queue.StateExpired) {
			rec.Unbook(b.Job)
		}
	}
	return nil
}

// loadTenant is loadTenantTx in its own read transaction (s.mu held).
func (s *Store) loadTenant(name string) (*tenantMem, error) {
	if tm, ok := s.tenants[name]; ok {
		return tm, nil
	}
	var tm *tenantMem
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		tm, err = s.loadTenantTx(tx, name)
		return err
	})
	return tm, queue.Unavailable(err)
}

// putTenant writes the tenant's current in-memory record (to the tenant
// log: see logTenant).
func (s *Store) putTenant(tx *bbolt.Tx, name string) error {
	s.mu.Lock()
	tm, ok := s.tenants[name]
	var rec rules.Record
	if ok {
		rec = tm.rec
		tm.dirty = true // kept in memory until flushDirty writes it in place
	}
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return logTenant(tx, name, rec)
}

// logTenant appends a tenant's record to the tenant log. Every change of a
// tenant's record goes there: an admission's commit then adds to one page
// of the log for all its tenants, where writing each record in place wrote
// a page per tenant (records of 1000 tenants spread over dozens of pages,
// and a commit costs on this disk about 15 µs per page written). The records
// are written in place every maintainEvery, at a clean stop and at open
// (flushDirty, replayTenantLog), and the log emptied in the same
// transaction; a tenant with records in the log is marked dirty, so it stays
// in memory (and is read from there, never from bucketTenants) until then.
func logTenant(tx *bbolt.Tx, name string, rec rules.Record) error {
	return putTenantLogEntry(tx, tenantLogEntry(name, rec))
}

// tenantLogEntry is the tenant log's value for a tenant's record.
func tenantLogEntry(name string, rec rules.Record) []byte {
	return appendTenantLogEntry(make([]byte, 0, 80), name, rec)
}

// appendTenantLogEntry appends tenantLogEntry(name, rec) to b.
func appendTenantLogEntry(b []byte, name string, rec rules.Record) []byte {
	return encodeTenant(appendString(b, name), rec)
}

// putTenantLogEntry appends an entry (tenantLogEntry) to the tenant log.
func putTenantLogEntry(tx *bbolt.Tx, entry []byte) error {
	b := tx.Bucket(bucketTenantLog)
	b.FillPercent = 1 // appended: pages are filled, not split in halves
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq), entry)
}

// replayTenantLog writes the records of the tenant log in place, in order
// (the last of each tenant stays), and empties the log.
func replayTenantLog(tx *bbolt.Tx) error {
	tenants := tx.Bucket(bucketTenants)
	err := tx.Bucket(bucketTenantLog).ForEach(func(k, v []byte) error {
		d := decoder{b: v}
		name := d.string()
		if d.bad {
			return fmt.Errorf("tenant log entry %x: %w", k, errBadRecord)
		}
		return tenants.Put([]byte(name), slices.Clone(d.b))
	})
	if err != nil {
		return err
	}
	return resetTenantLog(tx)
}

// resetTenantLog empties the tenant log (its records are in place).
func resetTenantLog(tx *bbolt.Tx) error {
	if k, _ := tx.Bucket(bucketTenantLog).Cursor().First(); k == nil {
		return nil
	}
	if err := tx.DeleteBucket(bucketTenantLog); err != nil {
		return err
	}
	_, err := tx.CreateBucket(bucketTenantLog)
	return err
}

// putTenantRecord writes a tenant's record in place (codec.go).
func putTenantRecord(tx *bbolt.Tx, name string, rec rules.Record) error {
	return tx.Bucket(bucketTenants).Put([]byte(name), encodeTenant(make([]byte, 0, 64), rec))
}

// Tenant implements queue.Store.
func (s *Store) Tenant(ctx context.Context, name string) (queue.TenantStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tm, err := s.loadTenant(name)
	if err != nil {
		return queue.TenantStatus{}, err
	}
	return s.status(name, tm, s.clock.Now()), nil
}

func (s *Store) status(name string, tm *tenantMem, now time.Time) queue.TenantStatus {
	_, ceiling := s.ceiling(name)
	pz := tm.rec.Pause
	paused, until := pz.Paused(now)
	return queue.TenantStatus{
		Tenant:        name,
		QueueDepth:    tm.depth,
		Scheduled:     tm.scheduled,
		InFlight:      tm.inFlight,
		ExpectedDelay: rules.ExpectedDelay(tm.rec, now, s.policy(name), ceiling, tm.depth, time.Time{}),
		LimitedBy:     rules.LimitOf(tm.rec, now, s.policy(name), ceiling, tm.depth),
		Expired:       tm.rec.Expired,
		Paused:        paused,
		PausedUntil:   until,
		Held:          !pz.Held.IsZero(),
		Accepted:      tm.rec.Accepted,
		Rejected:      tm.rec.Rejected,
		Delivered:     tm.rec.Delivered,
		Failed:        tm.rec.Failed,
		Cancelled:     tm.rec.Cancelled,
	}
}

// Tenants implements queue.Store.
func (s *Store) Tenants(ctx context.Context, offset, limit int) ([]queue.TenantStatus, error) {
	now := s.clock.Now()
	s.mu.Lock()
	var all []queue.TenantStatus
	for name, tm := range s.tenants {
		if tm.depth > 0 || tm.inFlight > 0 || tm.scheduled > 0 {
			all = append(all, s.status(name, tm, now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b queue.TenantStatus) int {
		return cmp.Or(cmp.Compare(b.QueueDepth, a.QueueDepth), cmp.Compare(b.InFlight, a.InFlight), cmp.Compare(a.Tenant, b.Tenant))
	})
	if offset >= len(all) {
		return nil, nil
	}
	all = all[offset:]
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}
