package bolt

import (
	"bytes"
	"context"

	"go.etcd.io/bbolt"
)

// bucketPolicies: tenant -> its policy as the API set it (JSON).
var bucketPolicies = []byte("policies")

// PutPolicy keeps tenant's policy layer (queue.Policies), in the next
// group write: many set at once share its sync.
func (s *Store) PutPolicy(_ context.Context, tenant string, layer []byte) (uint64, error) {
	layer = bytes.Clone(layer)
	return 0, s.commit(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketPolicies)
		if err != nil {
			return err
		}
		return b.Put([]byte(tenant), layer)
	})
}

// DropPolicy forgets tenant's policy layer (queue.Policies).
func (s *Store) DropPolicy(_ context.Context, tenant string) (bool, uint64, error) {
	had := false
	err := s.commit(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketPolicies)
		if b == nil || b.Get([]byte(tenant)) == nil {
			had = false
			return nil
		}
		had = true
		return b.Delete([]byte(tenant))
	})
	return had, 0, err
}

// AllPolicies is every policy layer kept (queue.Policies); one process
// writes them all, so there are no changes to follow (0).
func (s *Store) AllPolicies(context.Context) (map[string][]byte, uint64, error) {
	all, err := readPolicies(s.db)
	return all, 0, err
}

func readPolicies(db *bbolt.DB) (map[string][]byte, error) {
	all := map[string][]byte{}
	err := db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketPolicies)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			all[string(k)] = bytes.Clone(v)
			return nil
		})
	})
	return all, err
}
