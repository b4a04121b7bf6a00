package bolt

import (
	"bytes"
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/startstop"
)

// newReaper removes finished jobs past retention, a bounded number a pass.
func (s *Store) newReaper() *startstop.Periodic {
	return &startstop.Periodic{Name: "reaper", Every: maintainEvery, Run: func(context.Context) {
		if n, err := s.reap(s.clock.Now().Add(-s.retention), 1000); err != nil {
			s.log.Error("cannot remove old finished jobs", "err", err)
		} else if n > 0 {
			s.log.Debug("removed finished jobs past retention", "jobs", n)
		}
	}}
}

// reap deletes up to limit finished jobs that finished before cutoff, with
// their idempotency keys.
func (s *Store) reap(cutoff time.Time, limit int) (int, error) {
	n := 0
	err := s.update(func(tx *bbolt.Tx) error {
		n = 0
		jobs, done, idem := tx.Bucket(bucketJobs), tx.Bucket(bucketDone), tx.Bucket(bucketIdem)
		c := done.Cursor()
		for k, _ := c.First(); k != nil && n < limit; k, _ = c.First() {
			at, id := parseDueKey(k)
			if !at.Before(cutoff) {
				break
			}
			if j, ok, _ := getJob(tx, id, false); ok {
				if j.IdempotencyKey != "" && bytes.Equal(idem.Get(idemKey(j.Tenant, j.IdempotencyKey)), []byte(id)) {
					if err := idem.Delete(idemKey(j.Tenant, j.IdempotencyKey)); err != nil {
						return err
					}
				}
				if j.State == queue.StateFailed {
					if err := tx.Bucket(bucketFailed).Delete(failedKey(j)); err != nil {
						return err
					}
				}
			}
			if err := dropCallback(tx, id, true); err != nil {
				return err
			}
			if err := jobs.Delete([]byte(id)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketPayloads).Delete([]byte(id)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketResponses).Delete([]byte(id)); err != nil {
				return err
			}
			if err := done.Delete(k); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}
