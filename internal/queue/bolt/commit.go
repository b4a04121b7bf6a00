package bolt

import (
	"errors"

	bbolt "go.etcd.io/bbolt"
)

// Admissions are made durable by group commit without a window: one
// goroutine (the committer) writes, and each transaction carries every write
// that arrived while the one before it was committing. Under load that is as
// many as are waiting (a commit is two fdatasyncs); at rest a write is
// committed at once, where bbolt's Batch would first wait MaxBatchDelay for
// others. Nothing is answered before its commit returns.

// maxGroup bounds the writes one transaction carries.
const maxGroup = 1000

var errClosed = errors.New("embedded store is closed")

type commitReq struct {
	fn   func(*bbolt.Tx) error
	done chan error
}

// commit runs fn in the next group transaction and returns once it is
// durable. fn may be run more than once (alone, if the group fails), and
// must not itself return an error but for a failed write.
func (s *Store) commit(fn func(*bbolt.Tx) error) error {
	r := commitReq{fn: fn, done: make(chan error, 1)}
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
		return nil
	})
	if err != nil && len(group) > 1 {
		for _, r := range group {
			r.done <- s.db.Update(r.fn)
		}
		return
	}
	for _, r := range group {
		r.done <- err
	}
}
