package main

import (
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
)

// The sink's report names the repeated key, the silence of a restart and
// the tenant that broke the window rule, and nothing for one that did not.
func TestSinkReport(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int, tenant, key string) downstreamtest.Arrival {
		return downstreamtest.Arrival{At: t0.Add(time.Duration(ms) * time.Millisecond), Tenant: tenant, Key: key}
	}
	all := []downstreamtest.Arrival{
		at(0, "calm", "c1"), at(0, "eager", "e1"),
		at(500, "eager", "e2"), // 500 ms after e1 at T = 1 s
		at(3000, "calm", "c1"), // sent again after a 2.5 s silence
		at(4000, "calm", "c2"),
	}
	var b strings.Builder
	reportSink(&b, all, time.Second, 1, time.Second)
	out := b.String()
	for _, want := range []string{
		"arrivals 5, distinct keys 4 (repeats 1), tenants 2",
		"silence of 2.5s",
		"closest pair of one tenant: 500ms",
		"tenants breaking the window rule: 1 of 2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "silence of") != 1 {
		t.Errorf("want one silence (the 1 s gaps are not over --silence):\n%s", out)
	}
}
