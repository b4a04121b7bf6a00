package main

import (
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Limits the vendor announces: a vendor that takes 10 requests in each
// fixed second (by the clock) and refuses the rest with 429 and
// Retry-After, announcing in every answer how many are left and when the
// window resets, and a tenant configured at 15/s. With the announcements
// read, no attempt is spent on a refusal once throttler has seen the first
// answer; with them off, the vendor refuses the 11th request of about
// every window. Every job is delivered either way.
func TestAnnouncedLimitsSpareTheRefusals(t *testing.T) {
	testutil.SkipShort(t, "process test: a vendor that announces its fixed windows, for seconds")
	// Not beside the other parallel tests (its runs are beside each
	// other): under their load an answer was read late enough for the
	// vendor to refuse a request after its first window.
	const perWindow = 10
	jobs := 60 // about 4 s at 15/s; THROTTLER_ANNOUNCED_JOBS=900 is the minute docs/BENCHMARKS.md gives
	if n, err := strconv.Atoi(os.Getenv("THROTTLER_ANNOUNCED_JOBS")); err == nil && n > 0 {
		jobs = n
	}
	for _, c := range []struct {
		name, style, scope string
		tenants            int
	}{
		{"off", "off", "tenant", 1},
		{"ietf", "ietf", "tenant", 1},
		{"x-ratelimit", "x-ratelimit", "tenant", 1},
		// Two tenants at 15/s each on one vendor account: a "none left"
		// holds them both.
		{"x-ratelimit-two-tenants-scope-downstream", "x-ratelimit", "downstream", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // waits on real time
			onEachStore(t, func(t *testing.T, redisURL string) {
				t.Parallel()
				v := &windowVendor{limit: perWindow, style: c.style}
				ds := downstreamtest.New(t)
				ds.Answer(v.answer)
				file := oneProcessConfig(t, redisURL, fmt.Sprintf("[downstreams.v]\nurl = %q\nrate_limit_headers = %q\nrate_limit_scope = %q\n[tenant_defaults]\nrate = \"15/s\"\ncapacity = %d\n",
					ds.URL+"/send", c.style, c.scope, jobs))
				p := startReady(t, file)
				names := map[string]string{}
				for tn := range c.tenants {
					maps.Copy(names, postBatchKeyed(t, p.base, tn, jobs/c.tenants))
				}
				total := len(names)
				// The vendor takes 10 a second, and at worst a hold of a
				// whole second follows each: 5 a second.
				testutil.WaitFor(t, time.Duration(total/5)*time.Second+30*time.Second, "every job taken by the vendor", func() bool {
					_, _, taken, _, _ := v.counts()
					return taken >= total
				})
				awaitEveryKey(t, ds, names, 100*time.Millisecond)
				refused, refusedLater, taken, first, last := v.counts()
				windows := last.Unix() - first.Unix() + 1 // the vendor's seconds from the first taken to the last
				t.Logf("%s: %d jobs over %d tenants, %d refused by the vendor (%d after its first window), %d taken in %d of its windows: %.1f a window of its %d",
					c.name, total, c.tenants, refused, refusedLater, taken, windows, float64(taken)/float64(windows), perWindow)
				if c.style == "off" {
					if refusedLater == 0 {
						t.Fatalf("with the announcements off, the vendor refused none after its first window: the test does not exercise them")
					}
					return
				}
				if refusedLater > 0 {
					t.Fatalf("with %s read (scope %s), the vendor still refused %d requests after its first window", c.style, c.scope, refusedLater)
				}
			})
		})
	}
}

// windowVendor takes limit requests in each second of the clock and
// refuses the rest (429, Retry-After to the next second), announcing the
// room left in style in every answer.
type windowVendor struct {
	limit int
	style string

	mu                    sync.Mutex
	start                 int64 // the second of the first request
	window                int64 // the second counted
	used                  int
	refused, refusedLater int
	taken                 int
	first, last           time.Time // of the requests taken
}

func (v *windowVendor) answer(w http.ResponseWriter, r *http.Request) {
	at := downstreamtest.ArrivalTime(r)
	sec := at.Unix()
	v.mu.Lock()
	if v.start == 0 {
		v.start = sec
	}
	if sec != v.window {
		v.window, v.used = sec, 0
	}
	ok := v.used < v.limit
	if ok {
		v.used++
		v.taken++
		if v.first.IsZero() {
			v.first = at
		}
		v.last = at
	} else {
		v.refused++
		if sec > v.start {
			v.refusedLater++
		}
	}
	left := v.limit - v.used
	v.mu.Unlock()
	reset := time.Unix(sec+1, 0)
	untilReset := int64(math.Ceil(time.Until(reset).Seconds()))
	switch v.style {
	case "ietf":
		w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, v.limit))
		w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, left, untilReset))
	case "x-ratelimit":
		w.Header().Set("X-RateLimit-Limit", strconv.Itoa(v.limit))
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(left))
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	}
	if !ok {
		w.Header().Set("Retry-After", strconv.FormatInt(max(untilReset, 1), 10))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (v *windowVendor) counts() (refused, refusedLater, taken int, first, last time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.refused, v.refusedLater, v.taken, v.first, v.last
}

// postBatchKeyed posts n jobs to tenant tn ("t<tn>") in one batch, job i
// with the key "k<tn>-i" in its payload (as postAtOnce's), and returns
// their keys by id.
func postBatchKeyed(t *testing.T, base string, tn, n int) map[string]string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"jobs":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"payload":{"key":"k%d-%d"}}`, tn, i)
	}
	b.WriteString(`]}`)
	st, _, body := call(t, "POST", fmt.Sprintf("%s/v1/tenants/t%d/jobs:batch", base, tn), b.String())
	results, _ := body["results"].([]any)
	if st != http.StatusOK || len(results) != n {
		t.Fatalf("a batch of %d: %d %v", n, st, body)
	}
	names := map[string]string{}
	for i, r := range results {
		m := r.(map[string]any)
		if m["status"] != float64(http.StatusAccepted) {
			t.Fatalf("job %d of the batch: %v", i, m)
		}
		names[m["id"].(string)] = fmt.Sprintf("k%d-%d", tn, i)
	}
	return names
}
