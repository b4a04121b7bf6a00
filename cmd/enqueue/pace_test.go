package main

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// Without --rate, enqueue paces itself by the RateLimit fields: a leaky
// tenant, a token tenant and a leaky tenant with a window, each fed more
// jobs than it has room for at once, are each refused (429) at most once
// (in fact never: the first request carries one job, each next one what
// the fields say is left), and every job gets in and is delivered once.
func TestPacesItselfWithoutRate(t *testing.T) {
	t.Parallel()
	ds, px := setup(t, `
[tenants.leaky]
rate = "20/s"
capacity = 5
[tenants.token]
mode = "token"
rate = "20/s"
burst = 5
[tenants.windowed]
rate = "50/s"
capacity = 5
windows = ["10/1s"]
`)
	runs := []struct {
		tenant string
		lines  int
		least  time.Duration // the rate alone keeps it from finishing sooner
	}{
		{"leaky", 40, (40 - 6) * 50 * time.Millisecond},
		{"token", 30, (30 - 5) * 50 * time.Millisecond},
		{"windowed", 30, 2 * time.Second},
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		file := writeLines(t, r.lines)
		wg.Go(func() {
			start := time.Now()
			code, out, errOut := runEnqueue(context.Background(), t, "", "--server", px.URL, "--tenant", r.tenant,
				"--file", file, "--idempotency-key", r.tenant, "--progress", "none", "--json")
			took := time.Since(start)
			var s summary
			if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil || s.Accepted != r.lines {
				t.Errorf("%s: exit %d %v\n%s%s", r.tenant, code, err, out, errOut)
				return
			}
			refused := px.countFor(r.tenant, 429)
			t.Logf("%s: %d jobs in %v, %d requests, %d refused", r.tenant, r.lines, took.Round(time.Millisecond), s.Requests, refused)
			if refused > 1 || s.Refusals != refused {
				t.Errorf("%s: refused %d times (enqueue counted %d): want at most once", r.tenant, refused, s.Refusals)
			}
			if took < r.least {
				t.Errorf("%s: done in %v, sooner than its limits allow (%v)", r.tenant, took, r.least)
			}
		})
	}
	wg.Wait()
	deliveredOnce(t, ds, 40+30+30)
}
