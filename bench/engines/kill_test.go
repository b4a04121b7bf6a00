package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestKill9KeepsAcknowledged runs each engine in a child process whose
// writers print every id once admit has returned, kills it with SIGKILL
// mid-load, and checks that every printed id is in the reopened store.
func TestKill9KeepsAcknowledged(t *testing.T) {
	if dir := os.Getenv("ENGINES_CHILD_DIR"); dir != "" {
		child(os.Getenv("ENGINES_CHILD_ENGINE"), dir)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, name := range engineNames {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store")
			cmd := exec.Command(os.Args[0], "-test.run=^TestKill9KeepsAcknowledged$")
			cmd.Env = append(os.Environ(), "ENGINES_CHILD_DIR="+path, "ENGINES_CHILD_ENGINE="+name)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var acked []string
			sc := bufio.NewScanner(out)
			for sc.Scan() && len(acked) < 3000 {
				acked = append(acked, sc.Text())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for sc.Scan() { // what was printed before the kill was acknowledged too
				acked = append(acked, sc.Text())
			}
			_ = cmd.Wait()
			jobs, _ := readBack(t, name, path)
			for _, id := range acked {
				if !jobs[id] {
					t.Fatalf("acknowledged job %s lost (%d acknowledged, %d kept)", id, len(acked), len(jobs))
				}
			}
			t.Logf("%d acknowledged, %d kept", len(acked), len(jobs))
		})
	}
}

// child admits from 32 writers until killed, printing each id once it is
// durable.
func child(name, path string) {
	e, err := open(name, path)
	if err != nil {
		fatal(err)
	}
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	for i := range 32 {
		go func() {
			for n := 0; ; n++ {
				a := newAdmission(time.Now(), (i*7+n)%1000, int64(n))
				if err := e.admit(a); err != nil {
					fatal(err)
				}
				mu.Lock()
				w.Write(a.id)
				w.WriteByte('\n')
				w.Flush()
				mu.Unlock()
			}
		}()
	}
	select {}
}
