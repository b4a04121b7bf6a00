package bolt

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
)

// DefaultReserve is the room kept free for outcomes, cancels and the
// maintainer when admissions fill the disk (store.reserve).
const DefaultReserve = 64 << 20

// Measuring the room is a statfs and a read of the file's free pages:
// cheap, but not per admission at tens of thousands a second. Between
// measures the bytes admitted are taken off the last one, and a new measure
// is made once they reach an eighth of the reserve, so admissions cannot
// run past the reserve between two looks.
const spaceEvery = 250 * time.Millisecond

// fullRetryAfter is the Retry-After of a refusal for a full store: room
// comes back as deliveries free payloads, at the tenants' pace.
const fullRetryAfter = 2 * time.Second

// space watches the room left to the store (DESIGN.md 6c): the
// filesystem's free bytes plus the pages the bbolt file has free for
// reuse (bbolt never gives them back to the filesystem, and a delivered
// job's payload is freed into them, so they are where room comes back).
// Under the reserve, admissions are refused; everything else goes on,
// since the reserve is theirs.
type space struct {
	path    string
	reserve int64 // <= 0: not enforced (a write that fails for room still marks it full)
	db      *bbolt.DB
	log     *slog.Logger

	mu       sync.Mutex
	at       time.Time // when free was measured (zero: measure now)
	free     int64
	admitted int64 // estimated bytes admitted since
	full     bool
	// hasBallast: the ballast file is there (see keepBallast).
	hasBallast bool
}

// room measures (if due) and returns the room and whether admissions are
// refused. A change of state is logged once, not per request.
func (sp *space) room(now time.Time) queue.SpaceStatus {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.at.IsZero() || now.Sub(sp.at) >= spaceEvery || sp.admitted >= max(sp.reserve/8, 1<<20) {
		sp.measure(now)
	}
	st := queue.SpaceStatus{Free: sp.free - sp.admitted, Reserve: sp.reserve, Full: sp.full}
	if st.Full {
		st.Err = &queue.StoreFullError{Path: sp.path, Free: max(st.Free, 0), Reserve: sp.reserve, RetryAfter: fullRetryAfter}
	}
	return st
}

// measure reads the room (sp.mu held).
func (sp *space) measure(now time.Time) {
	free, err := fsFree(filepath.Dir(sp.path))
	if err != nil {
		sp.log.Warn("cannot measure the store's free space", "path", sp.path, "err", err)
		return // keep the last measure
	}
	// Admissions in the write-ahead log (preallocated: they took no room
	// there) take theirs when they are written into the file: up to
	// walApplyBytes, not yet counted by the filesystem.
	free += int64(sp.db.Stats().FreeAlloc) - walApplyBytes
	sp.at, sp.free, sp.admitted = now, free, 0
	sp.setFull(sp.reserve > 0 && free < sp.reserve)
	if !sp.full && free >= sp.reserve+ballastSize {
		sp.keepBallast()
	}
}

// checkReserve refuses a reserve the store's filesystem can never have
// free (as large as the whole of it): every admission would be refused,
// 507 store_full, for ever, with no word at start. sizeOf is the size of
// the filesystem holding a directory (fsSize). A size it cannot read is
// left to the measures at run time.
func checkReserve(path string, reserve int64, sizeOf func(dir string) (int64, error)) error {
	if reserve <= 0 {
		return nil
	}
	size, err := sizeOf(filepath.Dir(path))
	if err != nil || reserve < size {
		return nil
	}
	return fmt.Errorf("embedded store %s: store.reserve (%s) is not smaller than its whole filesystem (%s in all): "+
		"no job could ever be admitted. Lower store.reserve (the room kept free for outcomes and cancels; \"0\" turns it off), "+
		"or put store.path on a larger filesystem", path, queue.Bytes(reserve), queue.Bytes(size))
}

// The ballast: a file of ballastSize beside the store, written while there
// is room, and removed when a write finds none (the reserve was too small,
// or another program filled the disk) and at an open on a full disk, so
// that outcomes and the open's replay of the write-ahead log always have
// room to be written. It is taken again once the room is back.
const ballastSize = walApplyBytes * 2

func (sp *space) ballastPath() string { return sp.path + "-ballast" }

// keepBallast writes the ballast if it is missing (sp.mu held).
func (sp *space) keepBallast() {
	if sp.hasBallast {
		return
	}
	if fi, err := os.Stat(sp.ballastPath()); err == nil && fi.Size() >= ballastSize {
		sp.hasBallast = true
		return
	}
	f, err := os.OpenFile(sp.ballastPath(), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		// Written, not truncated: a sparse file would hold no room.
		_, err = f.Write(make([]byte, ballastSize))
		if err == nil {
			err = f.Sync()
		}
		f.Close()
	}
	if err != nil {
		os.Remove(sp.ballastPath())
		sp.log.Warn("cannot write the store's ballast", "path", sp.ballastPath(), "err", err)
		return
	}
	sp.hasBallast = true
}

// releaseBallast removes the ballast, giving its room to the writes that
// need it now; it reports whether there was one.
func (sp *space) releaseBallast() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	err := os.Remove(sp.ballastPath())
	sp.hasBallast = false
	if err != nil {
		return false
	}
	sp.at = time.Time{} // measure again
	sp.log.Warn("released the store's ballast: the disk has no room left for outcomes", "path", sp.ballastPath(), "size", queue.Bytes(ballastSize))
	return true
}

// setFull changes the state, logging the change (sp.mu held).
func (sp *space) setFull(full bool) {
	if full == sp.full {
		return
	}
	sp.full = full
	if full {
		sp.log.Error("the store is full: new jobs are refused (507 store_full) until there is room; deliveries, outcomes and cancels go on",
			"path", sp.path, "free", queue.Bytes(max(sp.free, 0)), "reserve", queue.Bytes(sp.reserve))
		return
	}
	sp.log.Info("the store has room again: new jobs are admitted", "path", sp.path, "free", queue.Bytes(sp.free), "reserve", queue.Bytes(sp.reserve))
}

// admit takes the room n bytes of admissions need, or refuses them.
func (sp *space) admit(now time.Time, n int64) *queue.StoreFullError {
	st := sp.room(now)
	if st.Full {
		return st.Err
	}
	sp.mu.Lock()
	sp.admitted += n
	sp.mu.Unlock()
	return nil
}

// noSpace notes a write that failed for room (the reserve was too small,
// or something else filled the disk): full until the next measure says
// otherwise. It returns the refusal to answer with.
func (sp *space) noSpace(now time.Time) *queue.StoreFullError {
	sp.mu.Lock()
	sp.free, sp.at = 0, now
	sp.setFull(true)
	sp.mu.Unlock()
	return &queue.StoreFullError{Path: sp.path, Reserve: sp.reserve, RetryAfter: fullRetryAfter}
}

// isNoSpace reports whether err is a write that failed for room. bbolt
// formats some of its errors without wrapping them: the text is checked
// too.
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(err.Error(), syscall.ENOSPC.Error()))
}

// admissionBytes estimates what admitting jobs adds to the file: their
// payloads and requests, and a record each.
func admissionBytes(jobs []queue.NewJob) int64 {
	var n int64
	for _, j := range jobs {
		n += int64(len(j.Payload)) + 256
	}
	return n
}
