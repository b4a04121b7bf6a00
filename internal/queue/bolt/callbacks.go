package bolt

import (
	"context"
	"encoding/json"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
)

// The callbacks jobs' ends owe (DESIGN.md section 6b), kept beside the
// jobs: bucketCallbacks holds each one's state (JSON), bucketCallbackDue
// the pending ones by when they are next due. Both are written in the
// transaction that writes the job's final state (oweCallback).
var (
	bucketCallbacks   = []byte("callbacks")    // id -> queue.CallbackStatus (JSON)
	bucketCallbackDue = []byte("callback-due") // next_at + id -> nil: pending callbacks
)

// oweCallback records, in tx (the one writing j's final state), the
// callback j's end owes, if any: pending, due at once.
func oweCallback(tx *bbolt.Tx, j queue.Job, now time.Time) error {
	if !j.Callback.Owed(j.State) {
		return nil
	}
	// A job retried after a failure and ended again owes a new one.
	if err := dropCallback(tx, j.ID, false); err != nil {
		return err
	}
	return putCallback(tx, j.ID, queue.CallbackStatus{State: queue.CallbackPending, NextAt: now})
}

func putCallback(tx *bbolt.Tx, id string, st queue.CallbackStatus) error {
	raw, err := json.Marshal(st)
	if err != nil { // strings, ints and a time: cannot fail
		return err
	}
	if err := tx.Bucket(bucketCallbacks).Put([]byte(id), raw); err != nil {
		return err
	}
	if st.State != queue.CallbackPending {
		return nil
	}
	return tx.Bucket(bucketCallbackDue).Put(dueKey(st.NextAt, id), nil)
}

func getCallback(tx *bbolt.Tx, id string) (*queue.CallbackStatus, error) {
	raw := tx.Bucket(bucketCallbacks).Get([]byte(id))
	if raw == nil {
		return nil, nil
	}
	st := new(queue.CallbackStatus)
	if err := json.Unmarshal(raw, st); err != nil {
		return nil, errBadRecord
	}
	return st, nil
}

// dropCallback removes job id's pending callback from the due index, and
// its state too if all (the job is removed).
func dropCallback(tx *bbolt.Tx, id string, all bool) error {
	st, err := getCallback(tx, id)
	if err != nil || st == nil {
		return err
	}
	if st.State == queue.CallbackPending {
		if err := tx.Bucket(bucketCallbackDue).Delete(dueKey(st.NextAt, id)); err != nil {
			return err
		}
	}
	if !all {
		return nil
	}
	return tx.Bucket(bucketCallbacks).Delete([]byte(id))
}

// DueCallbacks implements queue.Store.
func (s *Store) DueCallbacks(ctx context.Context, limit int, lease time.Duration) ([]queue.Job, error) {
	now := s.clock.Now()
	var due []string
	// Read first: a sender asks often, and most times nothing is due (a
	// write transaction would commit, and sync, for nothing).
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketCallbackDue).Cursor()
		for k, _ := c.First(); k != nil && len(due) < limit; k, _ = c.Next() {
			at, id := parseDueKey(k)
			if at.After(now) {
				break
			}
			due = append(due, id)
		}
		return nil
	})
	if err != nil || len(due) == 0 {
		return nil, queue.Unavailable(err)
	}
	var out []queue.Job
	err = s.update(func(tx *bbolt.Tx) error {
		out = out[:0]
		for _, id := range due {
			st, err := getCallback(tx, id)
			if err != nil {
				return err
			}
			j, found, err := getJob(tx, id, false)
			if err != nil {
				return err
			}
			if err := dropCallback(tx, id, !found); err != nil {
				return err
			}
			if !found || st == nil || st.State != queue.CallbackPending || st.NextAt.After(now) {
				if found && st != nil && st.State == queue.CallbackPending {
					if err := putCallback(tx, id, *st); err != nil { // taken meanwhile: as it is
						return err
					}
				}
				continue // its job is gone: nothing to tell
			}
			if j.Response, err = getResponse(tx, id); err != nil {
				return err
			}
			st.NextAt = now.Add(lease)
			if err := putCallback(tx, id, *st); err != nil {
				return err
			}
			j.CallbackStatus = st
			out = append(out, j)
		}
		return nil
	})
	if err != nil {
		return nil, queue.Unavailable(err)
	}
	return out, nil
}

// CallbackAttempted implements queue.Store.
func (s *Store) CallbackAttempted(ctx context.Context, id string, a queue.CallbackAttempt) error {
	err := s.update(func(tx *bbolt.Tx) error {
		st, err := getCallback(tx, id)
		if err != nil || st == nil || st.State != queue.CallbackPending {
			return err
		}
		if err := dropCallback(tx, id, false); err != nil {
			return err
		}
		st.Attempts++
		switch {
		case a.Delivered:
			st.State, st.LastError, st.NextAt = queue.CallbackDelivered, "", time.Time{}
		case a.Retry.IsZero():
			st.State, st.LastError, st.NextAt = queue.CallbackFailed, a.Error, time.Time{}
		default:
			st.LastError, st.NextAt = a.Error, a.Retry
		}
		return putCallback(tx, id, *st)
	})
	if err != nil {
		return queue.Unavailable(err)
	}
	return nil
}
