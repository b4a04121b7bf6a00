package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"throttler/internal/downstreamtest"
)

// chromium finds Debian's Chromium; tests that need it skip without it,
// except in CI, where .ci/run installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (.ci/run installs it)")
	}
	t.Skip("chromium is not installed")
	return ""
}

// headless runs Chromium on url with extra flags and returns its stdout.
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3500"}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errOut.String())
	}
	return out.String()
}

var (
	depthCell  = regexp.MustCompile(`<tr data-tenant="([^"]+)"[^>]*><td>[^<]*</td><td class="depth">(\d+)</td>`)
	pointsAttr = regexp.MustCompile(`<canvas id="chart"[^>]*data-points="(\d+)"`)
)

func pageState(dom string) (map[string]int, int) {
	depths := map[string]int{}
	for _, m := range depthCell.FindAllStringSubmatch(dom, -1) {
		depths[m[1]], _ = strconv.Atoi(m[2])
	}
	points := 0
	if m := pointsAttr.FindStringSubmatch(dom); m != nil {
		points, _ = strconv.Atoi(m[1])
	}
	return depths, points
}

// The status page in a real browser: the numbers and the chart follow the
// queues. A screenshot is kept ($THROTTLER_ARTIFACTS, else the test's
// temporary directory).
func TestStatusPageInABrowser(t *testing.T) {
	bin := chromium(t)
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/h\"\ncapacity = 100\n[tenants.alpha]\n", ds))
	enqueue := func(tenant string, n int) {
		for i := 0; i < n; i++ {
			if st, _, b := call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs", fmt.Sprintf(`{"payload":%d}`, i)); st != 202 {
				t.Fatalf("%d %v", st, b)
			}
		}
	}
	enqueue("alpha", 5) // one goes at once, four wait
	enqueue("beta", 3)
	dom := headless(t, bin, base+"/", "--dump-dom")
	depths, points := pageState(dom)
	if depths["alpha"] != 4 || depths["beta"] != 2 || points < 2 {
		t.Fatalf("first look: depths %v, chart points %d\n%s", depths, points, dom)
	}
	enqueue("alpha", 10)
	dom = headless(t, bin, base+"/", "--dump-dom")
	depths, points = pageState(dom)
	if depths["alpha"] != 14 || points < 2 {
		t.Fatalf("after 10 more: depths %v, chart points %d", depths, points)
	}

	dir := os.Getenv("THROTTLER_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status-page.png")
	headless(t, bin, base+"/", "--screenshot="+shot, "--window-size=1280,720", "--hide-scrollbars")
	raw, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(raw, []byte("\x89PNG")) {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(raw))
}
