package main

import (
	"strings"
	"testing"

	"throttler/internal/downstreamtest"
)

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
