package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// repoFile is the file name of the repository (a path from its root).
func repoFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../../" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The compose file validates (docker-compose config works without an
// engine; .ci/run installs Debian's docker-compose).
func TestComposeFileValidates(t *testing.T) {
	t.Parallel()
	bin := testutil.Program(t, "docker-compose")
	out, err := exec.Command(bin, "-f", "../../docker-compose.yml", "config", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
}

// The Dockerfile builds what README runs: cmd/throttler, with the Go of
// go.mod, and serves the config it is given.
func TestDockerfileBuildsTheREADMEBinary(t *testing.T) {
	t.Parallel()
	docker, readme, gomod := repoFile(t, "Dockerfile"), repoFile(t, "README.md"), repoFile(t, "go.mod")
	if !regexp.MustCompile(`go build [^\n]*-o /out/throttler \./cmd/throttler`).Match(docker) {
		t.Fatal("the Dockerfile does not build ./cmd/throttler")
	}
	if !strings.Contains(string(readme), "go run ./cmd/throttler serve") {
		t.Fatal("README does not run ./cmd/throttler")
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil || !strings.Contains(string(docker), "FROM golang:"+string(goVersion[1])) {
		t.Fatalf("the Dockerfile's Go is not go.mod's (%s)", goVersion)
	}
}

func TestSystemdUnitIsHardened(t *testing.T) {
	t.Parallel()
	unit := repoFile(t, "deploy/throttler.service")
	for _, line := range []string{"DynamicUser=yes", "ProtectSystem=strict", "StateDirectory=throttler", "NoNewPrivileges=yes", "ExecReload=/bin/kill -HUP $MAINPID"} {
		if !strings.Contains(string(unit), line) {
			t.Errorf("unit lacks %s", line)
		}
	}
}

// Every metric the Grafana dashboard and the alert rules ask for is one the
// service exports, and the operations page's table lists every one it
// exports.
func TestDashboardUsesRealMetrics(t *testing.T) {
	t.Parallel()
	raw := repoFile(t, "deploy/grafana-dashboard.json")
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil || len(dash.Panels) == 0 {
		t.Fatalf("dashboard: %v", err)
	}
	ds := downstreamtest.New(t)
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		if body, _ := io.ReadAll(r.Body); string(body) == `"fail"` {
			http.Error(w, "no", 400)
		}
	})
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 1\n[tenants.acme]\n", ds))
	// One delivered, one failed, one refused: every series has a sample.
	call(t, "POST", base+"/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":"ok"},{"payload":"fail"},{"payload":"refused"}]}`)
	testutil.WaitFor(t, 5*time.Second, "the attempts", func() bool {
		_, _, b := call(t, "GET", base+"/v1/tenants/acme", "")
		return b["failed_total"] == 1.0 && b["delivered_total"] == 1.0
	})
	exported := scrape(t, base)
	name := regexp.MustCompile(`throttler_[a-z_]+`)
	// Whole names, from the families' TYPE lines: a histogram's series
	// are its name with _bucket, _sum and _count.
	names := map[string]bool{}
	for _, f := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(exported, -1) {
		names[f[1]] = true
		if f[2] == "histogram" {
			names[f[1]+"_bucket"], names[f[1]+"_sum"], names[f[1]+"_count"] = true, true, true
		}
	}
	for _, m := range redisOnlyMetrics {
		names[m] = true // checked on Redis processes: everyPartitionHeldOnce
	}
	isExported := func(m string) bool { return names[m] }
	// The operations page's metrics table names every family the service
	// exports.
	ops := string(repoFile(t, "docs/operations.md"))
	for _, f := range regexp.MustCompile(`(?m)^# TYPE (throttler_\S+) `).FindAllStringSubmatch(exported, -1) {
		if !strings.Contains(ops, "| `"+f[1]+"` |") {
			t.Errorf("docs/operations.md's metrics table lacks %s", f[1])
		}
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				if !isExported(m) {
					t.Errorf("panel %q uses %s, which is not exported", p.Title, m)
				}
			}
		}
	}
	// The alert rules too (deploy/alerts.yml: their names in expressions
	// are the only throttler_ words in it).
	for _, m := range name.FindAllString(string(repoFile(t, "deploy/alerts.yml")), -1) {
		if !isExported(m) {
			t.Errorf("deploy/alerts.yml uses %s, which is not exported", m)
		}
	}
}

// The Prometheus config and its alert rules are valid to Prometheus, and
// each alert fires when it should and not otherwise: deploy/alerts_test.yml,
// run by promtool (.ci/run
// installs Debian's prometheus package for it).
func TestAlertRulesFireAsTested(t *testing.T) {
	t.Parallel()
	promtool := testutil.Program(t, "promtool")
	for _, args := range [][]string{{"check", "config", "prometheus.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../../deploy"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
