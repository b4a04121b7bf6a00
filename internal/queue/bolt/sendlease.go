package bolt

import (
	"encoding/binary"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// The store's lease on sending, as a Redis owner has on its partition: no
// request is written at or after the moment last made durable in the file
// (queue.MaySend says no past it). The store writes no claim, so a restart
// after a crash cannot tell which jobs whose time had come were written;
// the lease says by when they were: a send with no outcome recorded
// counts in its tenant's windows at the earlier of the restart and the
// lease's end (rules.Pickup.SentBy), not at its slot, and a crash followed
// by a long outage does not count the jobs that came due meanwhile as
// sent at the restart. It is renewed while jobs are handed over or in
// flight: one write every sendLeaseRenew at most, in a group commit.
const (
	sendLeaseFor   = 10 * time.Second
	sendLeaseRenew = 2 * time.Second
)

var keySendsUntil = []byte("sends-until")

// mayWrite reports whether a request may be written now (queue.MaySend).
func (s *Store) mayWrite() bool { return s.clock.Now().UnixNano() < s.sendsUntil.Load() }

// renewSendLease makes the lease run to sendLeaseFor from now, durably,
// once less than sendLeaseFor - sendLeaseRenew of it is left.
func (s *Store) renewSendLease() error {
	now := s.clock.Now()
	if s.sendsUntil.Load() > now.Add(sendLeaseFor-sendLeaseRenew).UnixNano() {
		return nil
	}
	until := now.Add(sendLeaseFor).UnixNano()
	if err := s.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySendsUntil, binary.BigEndian.AppendUint64(nil, uint64(until)))
	}); err != nil {
		return err
	}
	for {
		old := s.sendsUntil.Load()
		if old >= until || s.sendsUntil.CompareAndSwap(old, until) {
			return nil
		}
	}
}

// keepSendLease renews the lease if it is due: beside the sends while
// enough of it is left for the jobs being handed over (the dispatcher's
// loop does not wait for a commit), at once when it has run out or
// nearly (after an idle spell). A failure is logged: the sends stop once
// the lease ends, and go again once it is renewed.
func (s *Store) keepSendLease() {
	left := time.Duration(s.sendsUntil.Load() - s.clock.Now().UnixNano())
	switch {
	case left > sendLeaseFor-sendLeaseRenew:
	case left > sendLeaseRenew:
		if s.leaseRenewing.CompareAndSwap(false, true) {
			go func() {
				defer s.leaseRenewing.Store(false)
				s.renewSendLeaseLogged()
			}()
		}
	default:
		s.renewSendLeaseLogged()
	}
}

func (s *Store) renewSendLeaseLogged() {
	if err := s.renewSendLease(); err != nil && !s.isClosing() {
		now := s.clock.Now()
		if last := s.leaseWarned.Load(); now.Sub(time.Unix(0, last)) >= time.Second && s.leaseWarned.CompareAndSwap(last, now.UnixNano()) {
			s.log.Error("cannot renew the lease on sending: requests stop once it ends, and go again once it is renewed",
				"ends", time.Unix(0, s.sendsUntil.Load()).Format(time.RFC3339Nano), "err", err)
		}
	}
}

// sentBy is the latest moment the last process may have written a request,
// as a restart at now finds the file: the end of its lease, or now for a
// file with none (written by a build without it).
func sentBy(tx *bbolt.Tx, now time.Time) time.Time {
	v := tx.Bucket(bucketMeta).Get(keySendsUntil)
	if len(v) != 8 {
		return now
	}
	if until := time.Unix(0, int64(binary.BigEndian.Uint64(v))); until.Before(now) {
		return until
	}
	return now
}
