package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// throttlerBinary builds cmd/throttler once per test run. THROTTLER_TEST_BIN
// names a prebuilt binary to run instead: an older build, to show that a
// process test fails without the fix it checks.
func throttlerBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("THROTTLER_TEST_BIN"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "throttler-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "throttler")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// process is a throttler running as a child process.
type process struct {
	cmd  *exec.Cmd
	base string
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

// addrRE finds the address in the start line, logged as text or JSON.
var addrRE = regexp.MustCompile(`throttler started"?,?\s*"?addr"?[=:]"?([^"\s]+)`)

// startProcess runs `throttler serve --config file` and waits until it listens.
// Under -race it skips its test (skipUnderRace).
func startProcess(t *testing.T, file string, args ...string) *process {
	t.Helper()
	skipUnderRace(t)
	return startCommand(t, exec.Command(throttlerBinary(t), append([]string{"serve", "--config", file}, args...)...))
}

// skipUnderRace skips a test of child processes under -race: the child is
// built without the detector, which would watch only the test's side of
// it, and the plain pass runs the same checks (with their timing). The
// race pass's time goes to the tests that run the service in the test's
// own process.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if testutil.Race {
		t.Skip("a child process built without -race: the plain pass runs this test")
	}
}

// startCommand starts cmd, a throttler serving, and waits until it
// listens.
func startCommand(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{cmd: cmd, done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if m := addrRE.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if t.Failed() {
			t.Logf("process log:\n%s", p.logs())
		}
	})
	select {
	case a := <-addr:
		p.base = "http://" + a
	case <-p.done:
		t.Fatalf("throttler exited before listening:\n%s", p.logs())
	case <-time.After(15 * time.Second):
		t.Fatalf("throttler did not start:\n%s", p.logs())
	}
	return p
}

func (p *process) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// kill9 kills the process the way a crash would.
func (p *process) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.cmd.Wait()
}

// Jobs waiting when the process is killed are all delivered after a restart
// on the same file; a job may repeat only with the same Idempotency-Key, and
// pacing holds across the restart.
func TestKill9AndRestartLosesNothing(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 and restart of the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	file := writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds)
	p := startProcess(t, file)
	accepted := map[string]bool{}
	for i := 0; i < 30; i++ {
		st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, i))
		if st != 202 {
			t.Fatalf("job %d: %d %v", i, st, body)
		}
		accepted[body["id"].(string)] = true
	}
	testutil.WaitFor(t, 10*time.Second, "some deliveries before the kill", func() bool { return len(ds.All()) >= 8 })
	p.kill9(t)
	before := len(ds.All())

	p = startProcess(t, file)
	testutil.WaitFor(t, 20*time.Second, "every accepted job delivered", func() bool {
		seen := map[string]bool{}
		for _, a := range ds.All() {
			seen[a.Key] = true
		}
		return len(seen) == len(accepted)
	})
	nothingMoreWithin(300 * time.Millisecond) // late repeats would come now
	all := ds.All()
	repeats := 0
	seen := map[string]bool{}
	for _, a := range all {
		if !accepted[a.Key] {
			t.Fatalf("delivered Idempotency-Key %q that was never accepted", a.Key)
		}
		if seen[a.Key] {
			repeats++
		}
		seen[a.Key] = true
	}
	t.Logf("%d delivered before the kill, %d after, %d repeats (same Idempotency-Key)", before, len(all)-before, repeats)
	if repeats > 2 {
		t.Fatalf("%d repeats: only attempts in flight at the kill may repeat", repeats)
	}
	downstreamtest.CheckWindows(t, all, 100*time.Millisecond, 1)
	// The restarted process knows the jobs it delivered.
	_, _, ten := call(t, "GET", p.base+"/v1/tenants/acme", "")
	if ten["queue_depth"] != 0.0 || ten["accepted_total"] != 30.0 {
		t.Fatalf("tenant after restart: %v", ten)
	}
}

// SIGTERM stops cleanly: exit 0, and what waits is delivered after restart
// with no repeat.
func TestSigtermStopsCleanly(t *testing.T) {
	testutil.SkipShort(t, "process test: SIGTERM and restart of the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	// Each answer takes 150 ms, so the SIGTERM lands during an attempt: it
	// must finish and be recorded (no repeat after the restart).
	ds.Answer(answerAfter(150*time.Millisecond, 200))
	file := writeConfig(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 50\n", ds)
	p := startProcess(t, file)
	for i := 0; i < 20; i++ {
		if st, _, body := call(t, "POST", p.base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":%d}`, i)); st != 202 {
			t.Fatalf("%d %v", st, body)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "some deliveries", func() bool { return len(ds.All()) >= 5 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.done // read the log to its end before Wait closes the pipe
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs())
	}
	if !strings.Contains(p.logs(), "stopped cleanly") {
		t.Fatalf("log:\n%s", p.logs())
	}
	p = startProcess(t, file)
	testutil.WaitFor(t, 10*time.Second, "all 20 delivered", func() bool { return len(ds.All()) >= 20 })
	nothingMoreWithin(200 * time.Millisecond) // a repeat would come now
	seen := map[string]int{}
	for _, a := range ds.All() {
		seen[a.Key]++
		if seen[a.Key] > 1 {
			t.Fatalf("job %s sent twice after a clean stop", a.Key)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d distinct jobs delivered, want 20", len(seen))
	}
	downstreamtest.CheckWindows(t, ds.All(), 50*time.Millisecond, 1)
}

// kill -9 between the HTTP call and the recording of its result: the job
// is sent again after the restart with the same Idempotency-Key, and a
// downstream that dedupes on it carries out each job exactly once.
func TestKill9DuringAnAttemptRepeatsWithTheSameKey(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 and restart of the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	inAttempt, carriedOut := stallThirdJob(t, ds)
	file := writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds)
	p := startProcess(t, file)
	ids := enqueueN(t, p.base, "acme", 6)
	crashed := awaitStalled(t, inAttempt)
	p.kill9(t)

	p = startProcess(t, file)
	testutil.WaitFor(t, 15*time.Second, "every job delivered", func() bool { return allSucceeded(t, p.base, ids) })
	keys := ds.Keys()
	if keys[crashed] != 2 {
		t.Fatalf("the job in flight at the crash arrived %d times, want 2 (same Idempotency-Key)", keys[crashed])
	}
	checkCarriedOutOnce(t, carriedOut(), ids)
	downstreamtest.CheckWindows(t, ds.All(), 100*time.Millisecond, 1)
}

// stallThirdJob makes ds answer 200, except to the first attempt of the job
// whose payload has "n":2: that answer never comes (a crash is to lose it).
// inAttempt gets that job's key when it arrives. carriedOut counts, per
// Idempotency-Key, what a downstream that dedupes on it carries out: the
// stalled attempt counts (it was carried out, its answer lost), a repeat
// does not.
func stallThirdJob(t *testing.T, ds *downstreamtest.Server) (inAttempt <-chan string, carriedOut func() map[string]int) {
	return stallFirst(t, ds, func(_ *http.Request, body string) bool { return strings.Contains(body, `"n":2}`) })
}

// stallFirst is stallThirdJob for the first request that match holds for
// (it is asked of each request, one at a time, until it holds).
func stallFirst(t *testing.T, ds *downstreamtest.Server, match func(r *http.Request, body string) bool) (inAttempt <-chan string, carriedOut func() map[string]int) {
	var mu sync.Mutex
	done := map[string]int{}
	stalled := false
	arrived := make(chan string, 1)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := !stalled && match(r, readBody(r))
		if first {
			stalled = true
		}
		if done[key] == 0 {
			done[key]++
		}
		mu.Unlock()
		if first {
			arrived <- key
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return arrived, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(done)
	}
}

// awaitStalled waits for the attempt stallThirdJob (or stallFirst) stalls
// and returns its job's key.
func awaitStalled(t *testing.T, inAttempt <-chan string) string {
	t.Helper()
	select {
	case key := <-inAttempt:
		return key
	case <-time.After(10 * time.Second):
		t.Fatal("the job to stall never reached the downstream")
		return ""
	}
}

// checkCarriedOutOnce fails t unless a downstream that dedupes carried out
// every job of ids once.
func checkCarriedOutOnce(t *testing.T, done map[string]int, ids []string) {
	t.Helper()
	for _, id := range ids {
		if done[id] != 1 {
			t.Fatalf("job %s carried out %d times by a downstream that dedupes, want once", id, done[id])
		}
	}
}

// kill -9 while admissions pour in: every job answered 202 is there after
// the restart. Most of the answered ones are then in the write-ahead log
// only (its records go into the bbolt file in batches), so this is the
// log's promise checked with a real SIGKILL.
func TestKill9DuringAdmissionsLosesNoAnsweredJob(t *testing.T) {
	testutil.SkipShort(t, "process test: kill -9 and restart of the throttler binary")
	t.Parallel() // waits on real time and other processes: overlapped with the other parallel tests
	ds := downstreamtest.New(t)
	file := writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 50000\n", ds)
	p := startProcess(t, file)
	var mu sync.Mutex
	var answered []string
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				resp, err := client.Post(fmt.Sprintf("%s/v1/tenants/t%d/jobs", p.base, w), "application/json", strings.NewReader(fmt.Sprintf(`{"payload":{"n":%d}}`, i)))
				if err != nil {
					return // killed
				}
				var body struct {
					ID string `json:"id"`
				}
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusAccepted {
					return
				}
				mu.Lock()
				answered = append(answered, body.ID)
				mu.Unlock()
			}
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "some admissions", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(answered) >= 500
	})
	p.kill9(t)
	wg.Wait()

	p = startProcess(t, file)
	missing := 0
	for _, id := range answered {
		if st, _, _ := call(t, "GET", p.base+"/v1/jobs/"+id, ""); st != http.StatusOK {
			missing++
		}
	}
	t.Logf("%d jobs answered 202 before the kill, %d missing after the restart", len(answered), missing)
	if missing > 0 {
		t.Fatalf("%d of %d answered jobs lost by kill -9", missing, len(answered))
	}
}
