//go:build !linux

package bolt

import bbolt "go.etcd.io/bbolt"

// dropMappedPages is not done on this system.
func dropMappedPages(*bbolt.DB) error { return nil }
