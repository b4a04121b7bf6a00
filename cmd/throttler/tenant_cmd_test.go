package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	if err != nil || !strings.Contains(out, "plan free (from default)") || !strings.Contains(out, "capacity         7") || !strings.Contains(out, "set by the API: none") {
		t.Fatalf("show: %v\n%s%s", err, out, errOut)
	}
	file := out
	out, errOut, err = cli("tenant", "set", "acme", "--plan", "pro", "--capacity", "50", "--window", "1000/d")
	for _, want := range []string{"plan pro (from api)", "set by the API: yes", "rate             10/s                     plan", "capacity         50                       api", "windows          1000/d                   api"} {
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

// `tenant set --max-scheduled --schedule-horizon` send the policy keys
// max_scheduled and schedule_horizon (0 is sent: none may be scheduled),
// only when given; `tenant show` prints them with where they come from.
// A server standing in for the API answers.
func TestTenantScheduleKeys(t *testing.T) {
	t.Parallel()
	puts := make(chan string, 10)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/tenants/acme/policy" {
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodPut {
			raw, _ := io.ReadAll(r.Body)
			puts <- string(raw)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"tenant":"acme","plan":null,"plan_from":null,"policy":{"downstream":"default","mode":"leaky","rate":"1/s",
			"capacity":10,"burst":1,"windows":[],"max_attempts":null,"max_in_flight":0,"max_scheduled":500,"schedule_horizon":"168h0m0s","callback_url":""},
			"from":{"downstream":"default","mode":"default","rate":"default","capacity":"default","burst":"default","windows":"default",
			"max_attempts":"default","max_in_flight":"default","max_scheduled":"api","schedule_horizon":"api","callback_url":"default"},
			"api":{"max_scheduled":500,"schedule_horizon":"168h"}}`)
	}))
	t.Cleanup(api.Close)
	cli := func(args ...string) (string, string, error) {
		return runCLI(t, nil, append(args, "--server", api.URL)...)
	}
	out, errOut, err := cli("tenant", "set", "acme", "--max-scheduled", "500", "--schedule-horizon", "168h")
	if err != nil {
		t.Fatalf("set: %v\n%s%s", err, out, errOut)
	}
	var sent map[string]any
	if body := <-puts; json.Unmarshal([]byte(body), &sent) != nil || sent["max_scheduled"] != 500.0 || sent["schedule_horizon"] != "168h0m0s" {
		t.Errorf("set sent %s", body)
	}
	for _, want := range []string{"max_scheduled    500                      api", "schedule_horizon 168h0m0s                 api"} {
		if !strings.Contains(out, want) {
			t.Errorf("set: want %q in\n%s", want, out)
		}
	}
	if _, _, err := cli("tenant", "set", "acme", "--max-scheduled", "0"); err != nil {
		t.Fatal(err)
	}
	if body := <-puts; !strings.Contains(body, `"max_scheduled":0`) || strings.Contains(body, "schedule_horizon") {
		t.Errorf("--max-scheduled 0 sent %s", body)
	}
	if _, _, err := cli("tenant", "set", "acme", "--rate", "2/s"); err != nil {
		t.Fatal(err)
	}
	if body := <-puts; strings.Contains(body, "max_scheduled") || strings.Contains(body, "schedule_horizon") {
		t.Errorf("keys not given were sent: %s", body)
	}
	if _, errOut, err := cli("tenant", "set", "acme", "--schedule-horizon", "30d"); err == nil || !strings.Contains(errOut+err.Error(), "schedule-horizon") {
		t.Errorf("--schedule-horizon 30d: %v %q", err, errOut)
	}
	if out, _, err := cli("tenant", "show", "acme"); err != nil || !strings.Contains(out, "max_scheduled    500") || !strings.Contains(out, "schedule_horizon 168h0m0s") {
		t.Errorf("show: %v\n%s", err, out)
	}
}
