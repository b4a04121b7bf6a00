package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/testutil"
)

// The status page is driven in headless Chromium through what the existing
// flags give (--dump-dom, --screenshot, --virtual-time-budget): a proxy in
// front of the service adds testdata/pagedriver.js to the page, which does
// what an operator would (types a token, clicks) and reports each step to
// the test, which checks its effect through the API before the page goes
// on. Nothing of this is in the binary.

// chromium finds Debian's Chromium; tests that need it skip without it,
// except in CI, where .ci/run installs it. They run in the plain pass
// only: their time goes to Chromium, not to this process's goroutines,
// whose handlers the race pass checks in internal/api (a minute of the
// race pass for nothing more).
func chromium(t *testing.T) string {
	t.Helper()
	if testutil.Race {
		t.Skip("a browser test: the plain pass runs it; the race detector has nothing of its own to check here")
	}
	return testutil.Program(t, "chromium", "chromium-browser", "google-chrome")
}

// headless runs Chromium on url with extra flags for 3.5 s of the page's
// time and returns its stdout.
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	return headlessFor(t, bin, url, 3500*time.Millisecond, extra...)
}

// headlessFor is headless for budget of the page's time (virtual: it runs
// faster while the page is idle, and stands still while a request is out).
func headlessFor(t *testing.T, bin, url string, budget time.Duration, extra ...string) string {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--force-device-scale-factor=1", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=" + strconv.Itoa(int(budget/time.Millisecond))}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errOut.String())
	}
	return out.String()
}

// screenshot saves the page at a window size as name in the artefacts
// directory ($THROTTLER_ARTIFACTS, else the test's temporary one).
func screenshot(t *testing.T, bin, url, name string, width, height int, budget time.Duration) string {
	t.Helper()
	dir := os.Getenv("THROTTLER_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, name)
	headlessFor(t, bin, url, budget, "--screenshot="+shot, fmt.Sprintf("--window-size=%d,%d", width, height))
	raw, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(raw, []byte("\x89PNG")) {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(raw))
	return shot
}

// step is what the driver asks the test: check name's effect, answer ""
// (go on) or what is wrong.
type stepCheck func(name string, data map[string]any) string

// pageProxy is the proxy in front of the service at base: the page with
// the driver added (its plan from plan), everything else passed through. A
// server that is down shows as one: the connection is dropped.
func pageProxy(t *testing.T, base string, plan []map[string]any, check stepCheck) string {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	driver, err := os.ReadFile(filepath.Join("testdata", "pagedriver.js"))
	if err != nil {
		t.Fatal(err)
	}
	planJSON, _ := json.Marshal(map[string]any{"steps": plan})
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) { panic(http.ErrAbortHandler) }
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/" {
			return nil
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		raw = bytes.Replace(raw, []byte("</body>"), []byte(`<script src="/__driver.js"></script></body>`), 1)
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		resp.ContentLength = int64(len(raw))
		resp.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /__driver.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		fmt.Fprintf(w, "const PLAN = %s;\n%s", planJSON, driver)
	})
	mux.HandleFunc("POST /__step", func(w http.ResponseWriter, r *http.Request) {
		var data map[string]any
		_ = json.NewDecoder(r.Body).Decode(&data)
		answer := "ok"
		if check != nil {
			if msg := check(r.URL.Query().Get("name"), data); msg != "" {
				answer = msg
			}
		}
		io.WriteString(w, answer)
	})
	mux.Handle("/", rp)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

var driverLog = regexp.MustCompile(`(?s)<pre id="driver"[^>]*>(.*?)</pre>`)

// driven checks that the driver went through its plan, and returns its log.
func driven(t *testing.T, dom string) string {
	t.Helper()
	m := driverLog.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no driver log in the page:\n%s", dom)
	}
	log := html.UnescapeString(m[1])
	if !strings.HasSuffix(strings.TrimSpace(log), "done") {
		t.Fatalf("the page driver did not finish:\n%s", log)
	}
	return log
}
