package bolt

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// Every write of the store goes through one goroutine, the committer: the
// bbolt file has one writer anyway, and with one owner the write-ahead log
// (wal.go) needs no lock. Writes are grouped without a window: each group
// carries every write that arrived while the one before it was being made
// durable. A group of admissions only is appended to the log (one
// fdatasync); any other group is a bbolt transaction (two fdatasyncs) that
// first writes what the log holds. Nothing is answered before it is durable.

const (
	// maxGroup bounds the writes one group carries.
	maxGroup = 1000
	// The log's records are written into the bbolt file once they hold
	// walApplyJobs admissions or walApplyBytes, walApplyAfter after the
	// last write, and before any write that is not an admission: often
	// enough that the log never fills and the jobs read from memory
	// (s.unapplied) stay few, seldom enough that one transaction carries
	// a thousand of them.
	walApplyJobs  = 1024
	walApplyBytes = walSize / 4
	walApplyAfter = 20 * time.Millisecond
	// Under load a group waits up to gatherWindow for as many writes as the
	// one before it carried (from gatherFrom writes up): on these two cores
	// an fdatasync costs about 100 µs of CPU besides its wait, and fewer,
	// larger groups leave that CPU to the requests. A write at rest is
	// committed at once. (Measured: docs/BENCHMARKS.md.)
	gatherFrom   = 8
	gatherWindow = 300 * time.Microsecond
)

var errClosed = errors.New("embedded store is closed")

type commitReq struct {
	// admission: an Enqueue's writes as data (admissionOps), which the log
	// can hold; jobs are the jobs it admits, read from memory until the
	// bbolt file has them.
	admission []byte
	jobs      []queue.Job
	// fn: any other write. Grouped, it is run as bbolt's Batch runs it: in
	// a transaction with others, and again alone if that one fails.
	fn func(*bbolt.Tx) error
	// alone: fn is run once, in a transaction of its own (its effects go
	// beyond the transaction).
	alone bool
	// snapshot (tests): run between two writes, when nothing is written.
	snapshot func() error
	tenant   string // whose record to write after the write, once per group
	done     chan error
}

// commitAdmission makes an Enqueue's admissions durable (ops from
// admissionOps); the committer writes tenant's record with them.
func (s *Store) commitAdmission(tenant string, ops []byte, jobs []queue.Job) error {
	return s.send(commitReq{admission: ops, jobs: jobs, tenant: tenant})
}

// commit runs fn in the next group transaction and returns once it is
// durable. fn may be run more than once (alone, if the group fails), and
// must not itself return an error but for a failed write or a refusal of
// its own.
func (s *Store) commit(fn func(*bbolt.Tx) error) error {
	return s.send(commitReq{fn: fn})
}

// update runs fn once, in a transaction of its own. Once the store is
// closing and the committer has stopped, it runs it here: the finisher and
// Close write their last outcomes and records after that, one after the
// other.
func (s *Store) update(fn func(*bbolt.Tx) error) error {
	r := commitReq{fn: fn, alone: true, done: make(chan error, 1)}
	select {
	case <-s.committerDone:
		return s.updateTx(fn)
	case s.commits <- r:
	}
	if err, taken := s.answer(r); taken {
		return err
	}
	return s.updateTx(fn)
}

func (s *Store) send(r commitReq) error {
	r.done = make(chan error, 1)
	select {
	case s.commits <- r:
	case <-s.stop:
		return errClosed
	}
	if err, taken := s.answer(r); taken {
		return err
	}
	return errClosed
}

// answer waits for the committer's answer to r; taken is false if it
// stopped without taking r (s.commits is buffered: a write sent as the
// store closed may be left in it).
func (s *Store) answer(r commitReq) (err error, taken bool) {
	select {
	case err := <-r.done:
		return err, true
	case <-s.committerDone:
		select {
		case err := <-r.done:
			return err, true
		default:
			return nil, false
		}
	}
}

// committer writes groups until the store closes.
func (s *Store) committer() {
	defer close(s.committerDone)
	idle := time.NewTimer(s.logIdle)
	defer idle.Stop()
	gather := time.NewTimer(gatherWindow)
	defer gather.Stop()
	group := make([]commitReq, 0, 64)
	last := 0 // writes the last group carried
	for {
		group = group[:0]
		var applyDue <-chan time.Time
		if s.loggedJobs > 0 {
			idle.Reset(s.logIdle)
			applyDue = idle.C
		}
		select {
		case r := <-s.commits:
			group = append(group, r)
		case <-applyDue:
			s.applyNow()
			continue
		case <-s.stop:
			return
		}
		group = s.gather(group, last, gather)
		last = len(group)
		s.writeAll(group)
	}
}

// gather adds to a group the writes waiting, and under load (the last
// group carried gatherFrom or more) those that come within gatherWindow,
// until it carries as many as the last one.
func (s *Store) gather(group []commitReq, last int, window *time.Timer) []commitReq {
waiting:
	for len(group) < maxGroup {
		select {
		case r := <-s.commits:
			group = append(group, r)
		default:
			break waiting
		}
	}
	if last < gatherFrom || len(group) >= last {
		return group
	}
	window.Reset(gatherWindow)
	defer window.Stop()
	for len(group) < last {
		select {
		case r := <-s.commits:
			group = append(group, r)
		case <-window.C:
			return group
		}
	}
	return group
}

// writeAll writes a gathered group in order: the writes that must be alone
// split it.
func (s *Store) writeAll(group []commitReq) {
	start := 0
	for i, r := range group {
		if !r.alone && r.snapshot == nil {
			continue
		}
		s.writeGroup(group[start:i])
		start = i + 1
		if r.snapshot != nil {
			r.done <- r.snapshot()
		} else {
			r.done <- s.updateTx(r.fn)
		}
	}
	s.writeGroup(group[start:])
}

// writeGroup makes a group durable: in the log if it holds admissions only
// and fits, else in one transaction. If the transaction fails, each write
// is tried alone, so that one bad write fails only its own caller.
func (s *Store) writeGroup(group []commitReq) {
	if len(group) == 0 {
		return
	}
	s.groups.Add(1)
	s.grouped.Add(int64(len(group)))
	if err := s.logGroup(group); !errors.Is(err, errNotLogged) {
		for _, r := range group {
			r.done <- err
		}
		return
	}
	err := s.updateTx(func(tx *bbolt.Tx) error { return s.writeEach(tx, group) })
	if err != nil && len(group) > 1 {
		for _, r := range group {
			r.done <- s.updateTx(func(tx *bbolt.Tx) error { return s.writeEach(tx, []commitReq{r}) })
		}
		return
	}
	for _, r := range group {
		r.done <- err
	}
}

// writeEach runs a group's writes in tx, then writes their tenants'
// records.
func (s *Store) writeEach(tx *bbolt.Tx, group []commitReq) error {
	for _, r := range group {
		var err error
		if r.fn != nil {
			err = r.fn(tx)
		} else {
			err = applyOps(tx, r.admission)
		}
		if err != nil {
			return err
		}
	}
	return s.putTenants(tx, group)
}

// errNotLogged: the group is for a transaction (it is not admissions only,
// or it does not fit in the log).
var errNotLogged = errors.New("not for the log")

// logGroup appends a group of admissions to the log, with the records of
// their tenants as they are now, and lets their jobs be read from memory
// until they are in the bbolt file. The record's body is built at the end
// of s.logged, which holds every record the log has and the file has not.
func (s *Store) logGroup(group []commitReq) error {
	for _, r := range group {
		if r.admission == nil {
			return errNotLogged
		}
	}
	start := len(s.logged)
	body := s.logged
	for _, r := range group {
		body = append(body, r.admission...)
	}
	body = s.appendTenantEntries(body, group)
	s.logged = body
	err := s.wal.append(body[start:])
	if errors.Is(err, errWALFull) {
		// The log first goes into the file, without this record.
		rec := slices.Clone(body[start:])
		s.logged = s.logged[:start]
		if err := s.applyNow(); err != nil {
			return err
		}
		start = len(s.logged)
		s.logged = append(s.logged, rec...)
		err = s.wal.append(rec)
	}
	if err != nil {
		s.logged = s.logged[:start]
		if errors.Is(err, errWALFull) {
			return errNotLogged // larger than the log: the bbolt file takes it
		}
		return queue.Unavailable(err)
	}
	s.mu.Lock()
	for _, r := range group {
		for i := range r.jobs {
			j := &r.jobs[i]
			s.unapplied[j.ID] = j
			if j.IdempotencyKey != "" {
				s.unappliedKeys[string(idemKey(j.Tenant, j.IdempotencyKey))] = j.ID
			}
		}
		s.loggedJobs += len(r.jobs)
	}
	s.mu.Unlock()
	if s.loggedJobs >= walApplyJobs || s.wal.off >= walApplyBytes {
		if err := s.applyNow(); err != nil {
			if isNoSpace(err) {
				s.space.noSpace(s.clock.Now())
				s.space.releaseBallast()
			}
			s.log.Error("cannot write the write-ahead log into the store; trying again with the next write", "err", err)
		}
	}
	return nil
}

// loggedJob is a copy of the admitted job id that only the log has
// (s.mu held); false if the bbolt file has it, or nobody does.
func (s *Store) loggedJob(id string) (queue.Job, bool) {
	j, ok := s.unapplied[id]
	if !ok {
		return queue.Job{}, false
	}
	return *j, true
}

// applyNow writes what the log holds into the bbolt file.
func (s *Store) applyNow() error {
	return s.updateTx(func(*bbolt.Tx) error { return nil })
}

// updateTx runs fn in a transaction of its own, after the log's records.
// Only the committer calls it (and, once it has stopped, update).
func (s *Store) updateTx(fn func(*bbolt.Tx) error) error {
	s.chooseFreelistSync()
	applied := len(s.logged) > 0
	err := s.db.Update(func(tx *bbolt.Tx) error {
		if applied {
			if err := applyOps(tx, s.logged); err != nil {
				return err
			}
			if err := putWALApplied(tx, s.wal.seq); err != nil {
				return err
			}
		}
		return fn(tx)
	})
	if err == nil && applied {
		// Every job read from memory was in the log: the file has them all.
		s.mu.Lock()
		clear(s.unapplied)
		clear(s.unappliedKeys)
		s.mu.Unlock()
		s.logged, s.loggedJobs = s.logged[:0], 0
		s.wal.rewind()
	}
	return err
}

// freelistSyncMax is the most free pages whose list a commit writes: 64
// KB a commit at most (a file with more free space is walked at open after
// a crash instead).
const freelistSyncMax = 8192

// chooseFreelistSync decides whether the next commit writes bbolt's list of
// free pages (every write transaction runs on the committer, after it
// stopped, or in recover before it starts): while the list is short, so
// that an open after a crash reads it instead of walking the whole file to
// find the free pages (O(file)); once it is long (a file with much free
// space, after a backlog drained), every commit writing it would cost more
// than that walk. Close writes it whatever its length.
func (s *Store) chooseFreelistSync() {
	st := s.db.Stats()
	s.db.NoFreelistSync = !s.freelistAlways && st.FreePageN+st.PendingPageN > freelistSyncMax
}

// putTenants appends the records of the group's tenants to the tenant log
// (logTenant), each once, as they are in memory now (after every decision
// the group carries).
func (s *Store) putTenants(tx *bbolt.Tx, group []commitReq) error {
	return applyOps(tx, s.appendTenantEntries(nil, group))
}

// appendTenantEntries appends to b the tenant log entries (opTenantLog) of
// the group's tenants, each once, as their records are in memory now. The
// tenants are marked dirty: in the log (see logTenant).
func (s *Store) appendTenantEntries(b []byte, group []commitReq) []byte {
	recs, seen := s.tenantRecs[:0], s.tenantSeen
	clear(seen)
	s.mu.Lock()
	for _, r := range group {
		if r.tenant == "" || seen[r.tenant] {
			continue
		}
		seen[r.tenant] = true
		if tm, ok := s.tenants[r.tenant]; ok {
			recs = append(recs, namedRecord{r.tenant, tm.rec})
			tm.dirty = true
		}
	}
	s.mu.Unlock()
	// Encoded outside the lock: a record's slices are replaced, never
	// changed in place.
	for _, r := range recs {
		s.tenantEntry = appendTenantLogEntry(s.tenantEntry[:0], r.name, r.rec)
		b = appendTenantLog(b, s.tenantEntry)
	}
	clear(recs) // no tenant's slices kept alive by the scratch
	s.tenantRecs = recs[:0]
	return b
}

// namedRecord is a tenant's record and its name.
type namedRecord struct {
	name string
	rec  rules.Record
}

// snapshot copies the store as a kill -9 would leave it (tests): the bbolt
// file and the log, at one instant between two writes.
func (s *Store) snapshot(dbPath string) error {
	return s.send(commitReq{snapshot: func() error {
		if err := s.db.View(func(tx *bbolt.Tx) error { return tx.CopyFile(dbPath, 0o600) }); err != nil {
			return err
		}
		data, err := os.ReadFile(s.wal.path)
		if err != nil {
			return fmt.Errorf("copy the write-ahead log: %w", err)
		}
		return os.WriteFile(walPath(dbPath), data, 0o600)
	}})
}

// walPath is where the log of the store at path is.
func walPath(path string) string { return path + "-wal" }
