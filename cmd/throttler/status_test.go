package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/client"
	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite golden files")

// runCLI runs the throttler command tree in-process.
func runCLI(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut, env)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// knownState is a server with two tenants whose queues do not move for an
// hour: alpha with 2 jobs waiting, beta with 2 waiting and 2 refused.
func knownState(t *testing.T) string {
	t.Helper()
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, `
[tenant_defaults]
rate = "1/h"
capacity = 2
[tenants.alpha]
capacity = 10
`, ds))
	for tenant, n := range map[string]int{"alpha": 3, "beta": 5} {
		for i := 0; i < n; i++ {
			call(t, "POST", base+"/v1/tenants/"+tenant+"/jobs", fmt.Sprintf(`{"payload":%d}`, i))
		}
	}
	// The first job of each goes at once; wait until both are delivered.
	testutil.WaitFor(t, 10*time.Second, "first jobs delivered", func() bool {
		for _, tenant := range []string{"alpha", "beta"} {
			if _, _, b := call(t, "GET", base+"/v1/tenants/"+tenant, ""); b["delivered_total"] != 1.0 {
				return false
			}
		}
		return true
	})
	return base
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("%s differs (go test -run %s -update to accept):\n--- got\n%s--- want\n%s", name, t.Name(), got, want)
	}
}

func TestStatusTable(t *testing.T) {
	t.Parallel()
	base := knownState(t)
	out, _, err := runCLI(t, nil, "status", "--server", base)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "status.golden", out)
	out, _, err = runCLI(t, []string{"THROTTLER_SERVER=" + base}, "status", "beta")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "status-beta.golden", out)

	out, _, err = runCLI(t, nil, "status", "--server", base, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var tenants []client.Tenant
	if err := json.Unmarshal([]byte(out), &tenants); err != nil {
		t.Fatalf("--json does not parse: %v\n%s", err, out)
	}
	if len(tenants) != 2 || tenants[0].QueueDepth != 2 || tenants[1].RejectedTotal != 2 {
		t.Fatalf("tenants %+v", tenants)
	}

	// --watch redraws in place.
	out, _, err = runCLI(t, nil, "status", "--server", base, "--watch", "--interval", "10ms", "--rounds", "3")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\x1b[H\x1b[2J"); n != 3 {
		t.Fatalf("%d redraws, want 3:\n%q", n, out)
	}
}

func TestStatusErrors(t *testing.T) {
	t.Parallel()
	_, errOut, err := runCLI(t, nil, "status", "--server", "http://127.0.0.1:1")
	var ee exitError
	if !errorsAs(err, &ee) || ee.code != 3 || !strings.Contains(errOut, "unreachable") {
		t.Fatalf("unreachable: %v %q", err, errOut)
	}
	_, errOut, err = runCLI(t, nil, "status", "--server", "not a url")
	if !errorsAs(err, &ee) || ee.code != 2 || !strings.Contains(errOut, "want a URL") {
		t.Fatalf("bad url: %v %q", err, errOut)
	}
}

// The status command from the built binary, once.
func TestStatusBinary(t *testing.T) {
	testutil.SkipShort(t, "process test: builds the throttler binary to run its status command")
	t.Parallel()
	bin := throttlerBinary(t)
	base := knownState(t)
	out, err := exec.Command(bin, "status", "--server", base, "alpha").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "alpha") || !strings.Contains(string(out), "3h0m0s") {
		t.Fatalf("output:\n%s", out)
	}
}

// The pause and resume commands hold and resume a tenant through the API,
// and say what they did.
func TestPauseAndResumeCommands(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"1/s\"\n", ds))
	out, errOut, err := runCLI(t, nil, "pause", "acme", "--server", base)
	if err != nil || !strings.Contains(out, "acme: held until resumed") {
		t.Fatalf("pause: %v %q %q", err, out, errOut)
	}
	if _, _, ten := call(t, "GET", base+"/v1/tenants/acme", ""); ten["held"] != true {
		t.Fatalf("after pause: %v", ten)
	}
	out, errOut, err = runCLI(t, nil, "resume", "acme", "--server", base)
	if err != nil || !strings.Contains(out, "acme: running") {
		t.Fatalf("resume: %v %q %q", err, out, errOut)
	}
	if _, errOut, err := runCLI(t, nil, "pause", "no tenant", "--server", base); err == nil || !strings.Contains(errOut, "invalid_tenant") {
		t.Fatalf("bad tenant: %v %q", err, errOut)
	}
}
