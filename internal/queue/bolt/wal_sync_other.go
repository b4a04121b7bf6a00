//go:build !linux

package bolt

import "os"

// syncData flushes the log's data (fsync: fdatasync is Linux's).
func syncData(f *os.File) error { return f.Sync() }
