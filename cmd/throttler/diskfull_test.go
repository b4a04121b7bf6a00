package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// smallDisk mounts a tmpfs of size at a directory of the test's and
// unmounts it when the test ends. It needs root: skipped otherwise, but
// never in CI (CI=true), which runs as root.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	if os.Geteuid() != 0 {
		if ci {
			t.Fatal("a full disk is tested on a tmpfs mount, which needs root; CI runs the tests as root")
		}
		t.Skip("a full disk is tested on a tmpfs mount, which needs root")
	}
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		if ci {
			t.Fatalf("mount a tmpfs: %v: %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	// Registered before the processes start: cleanups run last first, so
	// this runs once they are killed.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes to a file in dir until the disk has no more than leave bytes
// free: another program eating the disk (again: it appends).
func fill(t *testing.T, dir string, leave int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "filler"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := int64(st.Bavail) * st.Bsize
		if free <= leave {
			return
		}
		n := min(int64(len(chunk)), free-leave)
		if _, err := f.Write(chunk[:n]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}

// DESIGN.md 6c on a real small filesystem: the embedded store on a 24 MiB
// tmpfs, store.reserve 4 MiB, a tenant at 20/s, 120 jobs of 256 KiB posted
// 5 ms apart while the downstream holds its answers (so no delivery frees
// room before the checks). Checked: admissions past the reserve are
// answered 507 store_full with Retry-After and a message naming the
// reserve (never 503), and /readyz and /metrics say so; after a kill -9 and
// the disk filled to the last byte by another program, the service starts
// (its ballast makes room for the log's replay), is still full, and once
// the downstream answers, delivers every accepted job and, as the delivered
// payloads free their room, admits new jobs again by itself.
func TestFullDiskRefusesAdmissionsAndDrains(t *testing.T) {
	testutil.SkipShort(t, "process test: the throttler binary on a full tmpfs, killed and restarted")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	disk := smallDisk(t, "24m")
	ds := downstreamtest.New(t)
	hold := make(chan struct{})
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	file := filepath.Join(t.TempDir(), "config.toml")
	cfg := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = %q\nreserve = \"4MiB\"\n[downstreams.test]\nurl = %q\ntimeout = \"30s\"\n[tenant_defaults]\nrate = \"20/s\"\ncapacity = 200\n",
		filepath.Join(disk, "throttler.db"), ds.URL+"/send")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, file)
	// Every refusal is checked as it comes (507 store_full naming the
	// reserve, with Retry-After). The full state is checked after the
	// restart, on a disk filled to its last byte: before the kill it need
	// not last, since the room the estimate holds back for the log's
	// records comes back once they are written into the file, and the
	// store rightly admits again (a quiet CI run saw /readyz ready and a
	// 202 right after the 96th refusal).
	accepted := fillWithJobs(t, p.base)
	p.kill9(t)
	fill(t, disk, 0)

	p = startProcess(t, file)
	// Started on a disk with no byte free. Full still, unless the start
	// gave room back (its ballast, the log's replay: a busy CI run saw
	// /readyz ready and a 202 after the restart): the other program eats
	// that too, until the store says full.
	testutil.WaitFor(t, 10*time.Second, "the store full after the restart, the disk eaten again", func() bool {
		fill(t, disk, 0)
		st, _, ready := call(t, "GET", p.base+"/readyz", "")
		return st == http.StatusServiceUnavailable && ready["error"] == "store_full"
	})
	checkFull(t, p.base)
	close(hold)
	testutil.WaitFor(t, 20*time.Second, "every accepted job delivered after the restart on the full disk", func() bool {
		keys := ds.Keys()
		for id := range accepted {
			if keys[id] == 0 {
				return false
			}
		}
		return true
	})
	for key := range ds.Keys() {
		if !accepted[key] {
			t.Fatalf("delivered %q, never accepted", key)
		}
	}
	// Room comes back by itself: the delivered payloads were freed.
	var id string
	testutil.WaitFor(t, 10*time.Second, "a new job admitted again", atMostEvery(100*time.Millisecond, func() bool {
		st, _, body := call(t, "POST", p.base+"/v1/tenants/big/jobs", `{"payload":"small"}`)
		if st == http.StatusAccepted {
			id = body["id"].(string)
		}
		return st == http.StatusAccepted
	}))
	if st, _, ready := call(t, "GET", p.base+"/readyz", ""); st != http.StatusOK {
		t.Errorf("/readyz with room again: %d %v", st, ready)
	}
	testutil.WaitFor(t, 5*time.Second, "the new job delivered", func() bool { return ds.Keys()[id] > 0 })
	logs := p.logs()
	if n := strings.Count(logs, "the store is full"); n != 1 || !strings.Contains(logs, "the store has room again") {
		t.Errorf("the full state logged %d times after the restart, want once, and its end:\n%s", n, logs)
	}
}

// fillWithJobs posts 120 jobs of 256 KiB, 5 ms apart, and returns the ids
// accepted; those refused must be refused 507 store_full.
func fillWithJobs(t *testing.T, base string) map[string]bool {
	t.Helper()
	payload := `{"payload":"` + strings.Repeat("x", 256<<10) + `"}`
	accepted := map[string]bool{}
	full := 0
	start := time.Now()
	for i := range 120 {
		arriveAt(start.Add(time.Duration(i) * 5 * time.Millisecond))
		st, h, body := call(t, "POST", base+"/v1/tenants/big/jobs", payload)
		switch st {
		case http.StatusAccepted:
			accepted[body["id"].(string)] = true
		case http.StatusInsufficientStorage:
			full++
			checkStoreFull(t, h, body)
		default:
			t.Fatalf("job %d: %d %v (want 202, or 507 once the disk is full)", i, st, body)
		}
	}
	t.Logf("120 jobs of 256 KiB on a 24 MiB disk: %d accepted, %d refused 507", len(accepted), full)
	if full == 0 || len(accepted) == 0 {
		t.Fatal("want some accepted, then 507 once the disk is full")
	}
	return accepted
}

// checkFull checks that the service says it is full: /readyz, the
// metric, and a new job refused 507.
func checkFull(t *testing.T, base string) {
	t.Helper()
	st, _, ready := call(t, "GET", base+"/readyz", "")
	if st != http.StatusServiceUnavailable || ready["error"] != "store_full" || !strings.Contains(fmt.Sprint(ready["message"]), "store.reserve") {
		t.Errorf("/readyz on a full disk: %d %v, want 503 store_full saying why", st, ready)
	}
	if v := value(scrape(t, base), "throttler_store_full"); v != 1 {
		t.Errorf("throttler_store_full = %v on a full disk, want 1", v)
	}
	st, h, body := call(t, "POST", base+"/v1/tenants/big/jobs", `{"payload":1}`)
	if st != http.StatusInsufficientStorage {
		t.Fatalf("a new job on a full disk: %d %v, want 507", st, body)
	}
	checkStoreFull(t, h, body)
}

// checkStoreFull checks a 507's answer: its code, message and Retry-After.
func checkStoreFull(t *testing.T, h http.Header, body map[string]any) {
	t.Helper()
	if body["error"] != "store_full" || !strings.Contains(fmt.Sprint(body["message"]), "store.reserve") || h.Get("Retry-After") == "" {
		t.Fatalf("507 answer: Retry-After %q, %v; want store_full naming store.reserve, with Retry-After", h.Get("Retry-After"), body)
	}
}

// A store.reserve the store's filesystem can never have free is refused
// at start, naming the key and what to do, instead of a service that
// answers every admission 507 for ever.
func TestReserveLargerThanTheDiskIsRefusedAtStart(t *testing.T) {
	testutil.SkipShort(t, "process test: starts the throttler binary")
	t.Parallel()
	ds := downstreamtest.New(t)
	file := writeConfig(t, "", ds)
	// A serve that does not refuse runs until the context kills it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, throttlerBinary(t), "serve", "--config", file, "--set", "store.reserve=1000TiB").CombinedOutput()
	var ee *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("serve with a reserve of 1000 TiB: %v (still running after 20 s: %v)\n%s", err, ctx.Err() != nil, out)
	}
	for _, want := range []string{"store.reserve (1000.0 TiB)", "Lower store.reserve", "larger filesystem"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("serve with a reserve of 1000 TiB said:\n%s\nwant %q in it", out, want)
		}
	}
}
