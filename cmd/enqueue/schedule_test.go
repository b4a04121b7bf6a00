package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// api stands in for a throttler's batch route: it records each request's
// jobs and answers each job with answer.
type api struct {
	*httptest.Server
	mu       sync.Mutex
	requests [][]map[string]any
}

func newAPI(t *testing.T, answer string) *api {
	t.Helper()
	a := &api{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct{ Jobs []map[string]any }
		if r.URL.Path != "/v1/tenants/acme/jobs:batch" || json.Unmarshal(raw, &body) != nil {
			http.Error(w, `{"error":"not_found","message":"m"}`, http.StatusNotFound)
			return
		}
		a.mu.Lock()
		a.requests = append(a.requests, body.Jobs)
		a.mu.Unlock()
		results := make([]string, len(body.Jobs))
		for i := range results {
			results[i] = fmt.Sprintf(answer, i)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"results":[%s]}`, strings.Join(results, ","))
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *api) sent() [][]map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]map[string]any(nil), a.requests...)
}

const scheduledAnswer = `{"status":202,"id":"j%d","tenant":"acme","state":"scheduled","dispatch_at":"2026-12-08T09:00:00Z",` +
	`"expected_delay_ms":3600000,"not_before":"2026-12-08T09:00:00Z","queue_depth":0,"capacity":10}`

// --not-before gives every job that not_before; --delay one not_before, a
// duration from the start of the run; the summary counts the jobs
// scheduled for later.
func TestEnqueueScheduled(t *testing.T) {
	t.Parallel()
	a := newAPI(t, scheduledAnswer)
	code, out, errOut := runEnqueue(context.Background(), t, "1\n2\n", "--server", a.URL, "--tenant", "acme", "--file", "-",
		"--not-before", "2026-12-08T10:00:00+01:00", "--progress", "none")
	if code != 0 || !strings.Contains(out, "2 accepted (2 scheduled for later)") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, req := range a.sent() {
		for _, j := range req {
			if j["not_before"] != "2026-12-08T09:00:00Z" || j["delay"] != nil {
				t.Errorf("--not-before: sent %v", j)
			}
		}
	}
	a = newAPI(t, scheduledAnswer)
	start := time.Now()
	code, out, errOut = runEnqueue(context.Background(), t, "", "--server", a.URL, "--tenant", "acme", "--data", `{"n":1}`,
		"--delay", "30m", "--expires-in", "2h", "--json", "--progress", "none")
	var s summary
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil || s.Scheduled != 1 {
		t.Fatalf("--delay: exit %d %v\n%s%s", code, err, out, errOut)
	}
	j := a.sent()[0][0]
	at, err := time.Parse(time.RFC3339, fmt.Sprint(j["not_before"]))
	if err != nil || at.Before(start.Add(30*time.Minute).Truncate(time.Second)) || at.After(time.Now().Add(30*time.Minute)) || j["deadline"] == nil {
		t.Errorf("--delay 30m at %v: sent %v", start, j)
	}
}

// --not-before and --delay are checked before anything is sent.
func TestEnqueueScheduleFlagsRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t, scheduledAnswer)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--not-before", "2026-12-08T09:00:00Z", "--delay", "1h"}, "--not-before and --delay together"},
		{[]string{"--not-before", "tomorrow"}, "RFC 3339"},
		{[]string{"--not-before", "2026-12-08 09:00"}, "RFC 3339"},
		{[]string{"--delay", "-5m"}, "--delay -5m0s"},
		{[]string{"--delay", "1h", "--expires-in", "30m"}, "--expires-in 30m0s ends by the jobs' not-before time"},
	} {
		args := append([]string{"--server", a.URL, "--tenant", "acme", "--data", "1", "--progress", "none"}, c.args...)
		code, out, errOut := runEnqueue(context.Background(), t, "", args...)
		if code != exitBadInput || !strings.Contains(errOut, c.says) {
			t.Errorf("%v: exit %d, want %d saying %q\n%s%s", c.args, code, exitBadInput, c.says, out, errOut)
		}
	}
	if code, _, errOut := runEnqueue(context.Background(), t, "", "--tenant", "acme", "--data", "1", "--delay", "soon"); code != exitUsage || !strings.Contains(errOut, "--delay") {
		t.Errorf("--delay soon: exit %d %q", code, errOut)
	}
	if n := len(a.sent()); n != 0 {
		t.Errorf("%d request(s) sent with flags refused", n)
	}
}

// A job refused with schedule_full (429 without Retry-After) is not sent
// again: exit 4, one request, the refusal named.
func TestEnqueueScheduleFullNotRetried(t *testing.T) {
	t.Parallel()
	a := newAPI(t, `{"status":429,"error":"schedule_full","message":"tenant acme has 3 jobs scheduled","tenant":"acme","scheduled":3,"max_scheduled":3,"_":%d}`)
	code, out, errOut := runEnqueue(context.Background(), t, "", "--server", a.URL, "--tenant", "acme", "--data", "1",
		"--delay", "1h", "--progress", "none", "--max-attempts", "5")
	if code != exitRejected || !strings.Contains(errOut, "schedule full") || !strings.Contains(errOut, "refused for good") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if n := len(a.sent()); n != 1 {
		t.Fatalf("%d requests, want 1: schedule_full is not retried", n)
	}
}
