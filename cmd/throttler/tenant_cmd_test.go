package main

import (
	"strings"
	"testing"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

// `throttler tenant set|show|reset` set a tenant's policy through the API,
// say where each key comes from, refuse a policy that does not hold naming
// the key (and change nothing), and give the file's back.
func TestTenantPolicyCommands(t *testing.T) {
	t.Parallel()
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, plansConfig+"[tenants.acme]\ncapacity = 7\n", ds))
	cli := func(args ...string) (string, string, error) {
		return runCLI(t, nil, append(args, "--server", base)...)
	}
	out, errOut, err := cli("tenant", "show", "acme")
	if err != nil || !strings.Contains(out, "plan free (from default)") || !strings.Contains(out, "capacity       7") || !strings.Contains(out, "set by the API: none") {
		t.Fatalf("show: %v\n%s%s", err, out, errOut)
	}
	file := out
	out, errOut, err = cli("tenant", "set", "acme", "--plan", "pro", "--capacity", "50", "--window", "1000/d")
	for _, want := range []string{"plan pro (from api)", "set by the API: yes", "rate           10/s                     plan", "capacity       50                       api", "windows        1000/d                   api"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("set: %v; want %q in\n%s%s", err, want, out, errOut)
		}
	}
	set := out
	for _, c := range []struct{ args, says string }{
		{"--plan gold", "policy.plan"},
		{"--rate fast", "policy.rate"},
		{"--window 5/fortnight", "policy.windows[0]"},
		{"--window 1/d --no-windows", "--no-windows and --window together"},
	} {
		_, errOut, err := cli(append([]string{"tenant", "set", "acme"}, strings.Fields(c.args)...)...)
		if err == nil || !strings.Contains(errOut, c.says) {
			t.Errorf("set %s: %v %q; want a refusal naming %s", c.args, err, errOut, c.says)
		}
		if out, _, _ := cli("tenant", "show", "acme"); out != set {
			t.Errorf("set %s changed the policy:\n%s", c.args, out)
		}
	}
	if out, errOut, err = cli("tenant", "reset", "acme"); err != nil || out != file {
		t.Fatalf("reset: %v\n%s%s\nwant the file's:\n%s", err, out, errOut, file)
	}
	if _, errOut, err := cli("tenant", "reset", "acme"); err == nil || !strings.Contains(errOut, "no_policy") {
		t.Errorf("a second reset: %v %q; want no_policy", err, errOut)
	}
}
