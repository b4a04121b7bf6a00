package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/throttler-dev/throttler/internal/testutil"
)

// The example, built and run as a user would, on the embedded store: its
// asynq ServeMux handles both task types through its middleware, a bad
// payload's SkipRetry fails the job, and SIGTERM stops it cleanly.
func TestExampleRuns(t *testing.T) {
	testutil.SkipShort(t, "process test: builds and runs the example, then SIGTERM")
	dir := t.TempDir()
	bin := filepath.Join(dir, "asynqmux")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	raw, err := os.ReadFile("config.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(raw), `listen = "127.0.0.1:8080"`, `listen = "127.0.0.1:0"`, 1)
	cfg = strings.Replace(cfg, `path = "data/asynqmux.db"`, fmt.Sprintf("path = %q", filepath.Join(dir, "t.db")), 1)
	cfg = strings.Replace(cfg, `rate = "5/s"`, `rate = "50/s"`, 1)
	file := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-config", file)
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var mu sync.Mutex
	var lines []string
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				addr <- a
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(15 * time.Second):
		t.Fatalf("the example did not start:\n%s", stderr.String())
	}
	jobs := []struct{ body, want string }{
		{`{"type": "email:welcome", "payload": {"to": "ada@example.com"}}`, "succeeded"},
		{`{"type": "email:welcome", "payload": {"to": "bob@example.com"}}`, "succeeded"},
		{`{"type": "sms:otp", "payload": {"to": "+15550100", "code": "123456"}}`, "succeeded"},
		{`{"type": "sms:otp", "payload": {"to": "+15550101", "code": "654321"}}`, "succeeded"},
		{`{"type": "email:welcome", "payload": {}}`, "failed"},
	}
	for _, j := range jobs {
		id := post(t, base+"/v1/tenants/acme/jobs", j.body)["id"].(string)
		testutil.WaitFor(t, 10*time.Second, j.body+" ends "+j.want, func() bool { return get(t, base+"/v1/jobs/"+id)["state"] == j.want })
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	starts := regexp.MustCompile(`^start \d+ type=(email:welcome|sms:otp) job=\w+ tenant=acme attempt=1$`)
	n := 0
	for _, l := range lines {
		if starts.MatchString(l) {
			n++
		}
	}
	if n != len(jobs) || !strings.Contains(strings.Join(lines, "\n"), "err=a welcome needs") {
		t.Fatalf("the middleware logged %d starts, want %d, and the SkipRetry:\n%s", n, len(jobs), strings.Join(lines, "\n"))
	}
}

func post(t *testing.T, url, body string) map[string]any {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, resp)
}

func get(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, resp)
}

func decode(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	return out
}
