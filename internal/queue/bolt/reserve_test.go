package bolt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

// A reserve as large as the store's whole filesystem can never be free:
// every admission would be refused, 507, for ever. The store refuses to
// open instead, saying what to do, and leaves no file behind; a reserve
// the filesystem can hold, or none, opens.
func TestReserveLargerThanTheFilesystemIsRefused(t *testing.T) {
	t.Parallel()
	const fsBytes = 32 << 20
	hooks := testHooks{fsSize: func(string) (int64, error) { return fsBytes, nil }}
	for _, c := range []struct {
		reserve int64
		opens   bool
	}{{0, false}, {fsBytes, false}, {1 << 40, false}, {fsBytes - 1<<20, true}, {-1, true}} {
		dir := t.TempDir()
		path := filepath.Join(dir, "t.db")
		s, err := open(path, Options{Policy: queuetest.Leaky20(10), Reserve: c.reserve}, hooks)
		if c.opens {
			if err != nil {
				t.Fatalf("reserve %d on a filesystem of %d: %v", c.reserve, fsBytes, err)
			}
			s.Close()
			continue
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		} else {
			s.Close()
		}
		for _, want := range []string{"store.reserve", "32.0 MiB", "Lower store.reserve", "larger filesystem"} {
			if !strings.Contains(msg, want) {
				t.Fatalf("reserve %d (0: the default) on a filesystem of %d: %q, want a refusal saying %q", c.reserve, fsBytes, msg, want)
			}
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("a refused open left %s behind: %v", path, err)
		}
	}
}
