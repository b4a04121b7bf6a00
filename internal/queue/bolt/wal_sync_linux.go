package bolt

import (
	"os"
	"syscall"
)

// syncData flushes the log's data: its size and blocks never change after
// it is preallocated, so the metadata fsync would also write is not needed.
func syncData(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
