package bolt

import (
	"errors"

	bbolt "go.etcd.io/bbolt"

	"throttler/internal/queue"
)

// Admissions are made durable by group commit without a window: one
// goroutine (the committer) writes, and each transaction carries every write
// that arrived while the one before it was committing. Under load that is as
// many as are waiting (a commit is two fdatasyncs); at rest a write is
// committed at once, where bbolt's Batch would first wait MaxBatchDelay for
// others. Nothing is answered before its commit returns.

// maxGroup bounds the writes one transaction carries.
const maxGroup = 1000

// putTenants appends the records of the group's tenants to the tenant log
// (logTenant), each once, as they are in memory now (after every decision
// the group carries).
func (s *Store) putTenants(tx *bbolt.Tx, group []commitReq) error {
	type rec struct {
		name string
		rec  queue.TenantRecord
	}
	recs := make([]rec, 0, len(group))
	seen := make(map[string]bool, len(group))
	s.mu.Lock()
	for _, r := range group {
		if r.tenant == "" || seen[r.tenant] {
			continue
		}
		seen[r.tenant] = true
		if tm, ok := s.tenants[r.tenant]; ok {
			recs = append(recs, rec{r.tenant, tm.rec})
			tm.dirty = true // in the log: see logTenant
		}
	}
	s.mu.Unlock()
	for _, r := range recs {
		if err := logTenant(tx, r.name, r.rec); err != nil {
			return err
		}
	}
	return nil
}

var errClosed = errors.New("embedded store is closed")

type commitReq struct {
	fn     func(*bbolt.Tx) error
	tenant string // whose record to write after fn, once per group
	done   chan error
}

// commit runs fn in the next group transaction, then writes tenant's
// record (once for all the writes of the group that name it), and returns
// once it is durable. fn may be run more than once (alone, if the group
// fails), and must not itself return an error but for a failed write.
func (s *Store) commit(tenant string, fn func(*bbolt.Tx) error) error {
	r := commitReq{fn: fn, tenant: tenant, done: make(chan error, 1)}
	select {
	case s.commits <- r:
	case <-s.stop:
		return errClosed
	}
	return <-r.done
}

// committer writes groups of commits until the store closes.
func (s *Store) committer() {
	defer close(s.committerDone)
	group := make([]commitReq, 0, 64)
	for {
		group = group[:0]
		select {
		case r := <-s.commits:
			group = append(group, r)
		case <-s.stop:
			return
		}
	gather:
		for len(group) < maxGroup {
			select {
			case r := <-s.commits:
				group = append(group, r)
			default:
				break gather
			}
		}
		s.writeGroup(group)
	}
}

// writeGroup commits a group in one transaction. If it fails, each write is
// tried alone, so that one bad write fails only its own caller.
func (s *Store) writeGroup(group []commitReq) {
	s.groups.Add(1)
	s.grouped.Add(int64(len(group)))
	err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, r := range group {
			if err := r.fn(tx); err != nil {
				return err
			}
		}
		return s.putTenants(tx, group)
	})
	if err != nil && len(group) > 1 {
		for _, r := range group {
			r.done <- s.db.Update(func(tx *bbolt.Tx) error {
				if err := r.fn(tx); err != nil {
					return err
				}
				return s.putTenants(tx, []commitReq{r})
			})
		}
		return
	}
	for _, r := range group {
		r.done <- err
	}
}
