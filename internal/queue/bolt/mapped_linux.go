package bolt

import (
	"os"
	"syscall"

	bbolt "go.etcd.io/bbolt"
)

// dropMappedPages lets go of the pages of the bbolt file that this process
// has read through its mapping (they stay in the page cache, and come back
// when read again): the open reads the index of waiting jobs, and after a
// crash may walk the whole file for its free pages; a restart's memory
// would otherwise show them all.
func dropMappedPages(db *bbolt.DB) error {
	fi, err := os.Stat(db.Path())
	if err != nil {
		return err
	}
	info := db.Info()
	size := fi.Size() &^ int64(info.PageSize-1) // within the mapping, which is at least the file
	if info.Data == 0 || size <= 0 {
		return nil
	}
	// The mapping's address comes from bbolt as a number: madvise takes
	// one, and no Go pointer is made of it.
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, info.Data, uintptr(size), syscall.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
