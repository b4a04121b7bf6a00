package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Go handlers on Redis (DESIGN.md section 6d): two worker processes of a
// program with handlers (examples/asynqmux, its asynq ServeMux) beside a
// stock API process on one Redis. One tenant's handler starts, seen by
// both workers, are at least T - 2 ms apart, and a kill -9 of the worker
// sending loses nothing: every job ends succeeded, and a job repeats only
// as itself (the same job id, the vendor's idempotency key).
func TestHandlerWorkersShareOneRedis(t *testing.T) {
	testutil.SkipShort(t, "process test: builds the asynqmux example and kills its workers on a redis-server")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	srv := redistest.Start(t, false)
	const T = 50 * time.Millisecond
	file := filepath.Join(t.TempDir(), "config.toml")
	cfg := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
shutdown_timeout = "5s"
[store]
backend = "redis"
redis_url = %q
redis_lease = "1s"
[downstreams.tasks]
handler = "tasks"
timeout = "2s"
[tenant_defaults]
downstream = "tasks"
rate = "%d/s"
capacity = 200
`, srv.URL(), int(time.Second/T))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	api := startProcess(t, file, "--role", "api") // a stock process: the config's handler is not its to call
	w1 := startHandlerWorker(t, file)
	w2 := startHandlerWorker(t, file)

	var ids []string
	accepted := map[string]bool{}
	for i := range 120 {
		typ := []string{"email:welcome", "sms:otp"}[i%2]
		st, _, body := call(t, "POST", api.base+"/v1/tenants/acme/jobs",
			fmt.Sprintf(`{"type": %q, "payload": {"to": "user%d", "code": "1"}}`, typ, i))
		if st != 202 {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		ids = append(ids, body["id"].(string))
		accepted[ids[i]] = true
	}
	// The worker that owns the tenant's partition is sending: kill it.
	testutil.WaitFor(t, 15*time.Second, "some handler starts", func() bool { return len(w1.starts())+len(w2.starts()) >= 30 })
	victim, other := w1, w2
	if len(w2.starts()) > len(w1.starts()) {
		victim, other = w2, w1
	}
	victim.kill9(t)
	waitAllSucceeded(t, api.base, ids, 30*time.Second)

	all := append(victim.starts(), other.starts()...)
	slices.SortFunc(all, func(a, b start) int { return a.at.Compare(b.at) })
	seen := map[string]int{}
	closest, closestAt := time.Duration(1<<62), 0
	for i := 1; i < len(all); i++ {
		if gap := all[i].at.Sub(all[i-1].at); gap < closest {
			closest, closestAt = gap, i
		}
	}
	t.Logf("closest starts: %v apart (starts %d and %d of %d)", closest, closestAt-1, closestAt, len(all))
	for i, s := range all {
		if !accepted[s.job] {
			t.Fatalf("a handler ran job %q, which was never accepted", s.job)
		}
		seen[s.job]++
		if i > 0 {
			if gap := s.at.Sub(all[i-1].at); gap < T-2*time.Millisecond {
				t.Fatalf("handler starts %d and %d (jobs %s, %s) %v apart, want at least T - 2 ms = %v", i-1, i, all[i-1].job, s.job, gap, T-2*time.Millisecond)
			}
		}
	}
	repeats := len(all) - len(seen)
	t.Logf("%d starts by the killed worker, %d by the other; %d repeats (the same job id)", len(victim.starts()), len(other.starts()), repeats)
	if len(seen) != len(ids) {
		t.Fatalf("the handlers ran %d distinct jobs, want %d", len(seen), len(ids))
	}
	if repeats > 2 {
		t.Fatalf("%d repeats: only a call in flight at the kill may repeat", repeats)
	}
	unknownTypeFailsAtOnce(t, api.base)
}

// unknownTypeFailsAtOnce: a job of a type the workers' ServeMux has no
// handler for, admitted by a stock API process (which has no handlers to
// ask), fails at its first attempt naming the type, not after
// max_attempts.
func unknownTypeFailsAtOnce(t *testing.T, base string) {
	st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"type": "fax:send", "payload": {"to": "user"}}`)
	if st != 202 {
		t.Fatalf("a job of an unknown type through the stock API: %d %v", st, body)
	}
	id := body["id"].(string)
	var j map[string]any
	testutil.WaitFor(t, 15*time.Second, "the job of an unknown type ended", func() bool {
		j = jobState(t, base, id)
		return j["state"] == "failed" || j["state"] == "succeeded"
	})
	if last, _ := j["last_error"].(string); j["state"] != "failed" || j["attempts"] != 1.0 || !strings.Contains(last, `"fax:send"`) {
		t.Fatalf("a job of an unknown type: %v, want failed after 1 attempt, naming its type", j)
	}
}

// handlerWorker is examples/asynqmux running as a Redis worker.
type handlerWorker struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	seen []start
	out  strings.Builder
	done chan struct{}
}

// start is one handler start the program's middleware logged.
type start struct {
	at  time.Time
	job string
}

var startRE = regexp.MustCompile(`^start (\d+) type=\S+ job=(\w+) `)

var (
	exampleOnce sync.Once
	exampleBin  string
	exampleErr  error
)

// startHandlerWorker builds examples/asynqmux once and runs it as a worker
// on file, until it serves /healthz.
func startHandlerWorker(t *testing.T, file string) *handlerWorker {
	t.Helper()
	exampleOnce.Do(func() {
		dir, err := os.MkdirTemp("", "asynqmux-bin-")
		if err != nil {
			exampleErr = err
			return
		}
		exampleBin = filepath.Join(dir, "asynqmux")
		if out, err := exec.Command("go", "build", "-o", exampleBin, "../../examples/asynqmux").CombinedOutput(); err != nil {
			exampleErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if exampleErr != nil {
		t.Fatal(exampleErr)
	}
	w := &handlerWorker{cmd: exec.Command(exampleBin, "-config", file, "-role", "worker"), done: make(chan struct{})}
	stdout, _ := w.cmd.StdoutPipe()
	w.cmd.Stderr = io.Discard
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{}, 1)
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			w.out.WriteString(line + "\n")
			if m := startRE.FindStringSubmatch(line); m != nil {
				ns, _ := strconv.ParseInt(m[1], 10, 64)
				w.seen = append(w.seen, start{at: time.Unix(0, ns), job: m[2]})
			}
			w.mu.Unlock()
			if strings.HasPrefix(line, "listening on ") {
				listening <- struct{}{}
			}
		}
	}()
	t.Cleanup(func() {
		w.cmd.Process.Kill()
		w.cmd.Wait()
	})
	select {
	case <-listening:
	case <-w.done:
		t.Fatal("the handler worker exited before it listened")
	case <-time.After(15 * time.Second):
		t.Fatal("the handler worker did not start")
	}
	return w
}

func (w *handlerWorker) starts() []start {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

func (w *handlerWorker) kill9(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w.done
	w.cmd.Wait()
}
