package main

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// Two jobs sent together as a burst (burst 2, one batch) are both answered
// 429 with Retry-After: 1. The store keeps their one slot, and its windows
// count each resend at it (DefectPushbackBurst and DefectPushbackWindow in
// the model test, which checks the store's schedule alone): this is what
// reaches the downstream in a running process. Every attempt counts, the
// 429s too. After the pause the resends come one interval apart, not as a
// burst; under a window of 3 sends in 2 s no 2 s holds more than 3
// attempts. The dispatcher's gate spaces every write by the rate and the
// windows.
func TestPushedBackBurstResendsPacedAndWindowed(t *testing.T) {
	t.Parallel()
	const T = 100 * time.Millisecond
	cases := []struct {
		name, windows string
		n             int           // in any window of this length ...
		length        time.Duration // ... at most n attempts (0: no window)
	}{
		{name: "Rate", n: 0},
		{name: "Window", windows: "windows = [\"3/2s\"]\n", n: 3, length: 2 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ds := downstreamtest.New(t)
			var mu sync.Mutex
			pushed := map[string]time.Time{}
			ds.Answer(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				// The burst: the first two requests, whichever jobs they
				// carry (two due at once reach the gate in either order,
				// and on a busy machine the third's lead can put it first).
				if r.Header.Get("X-Throttler-Attempt") == "1" && len(pushed) < 2 {
					pushed[r.Header.Get("Idempotency-Key")] = downstreamtest.ArrivalTime(r)
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\nburst = 2\ncapacity = 10\n"+c.windows, ds))
			st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":{"n":0}},{"payload":{"n":1}},{"payload":{"n":2}},{"payload":{"n":3}},{"payload":{"n":4}}]}`)
			if st != 200 {
				t.Fatalf("batch: %d %v", st, body)
			}
			var ids []string
			for i, r := range body["results"].([]any) {
				res := r.(map[string]any)
				if res["status"] != 202.0 {
					t.Fatalf("job %d: %v", i, res)
				}
				ids = append(ids, res["id"].(string))
			}
			waitAllSucceeded(t, base, ids, 20*time.Second)

			all := ds.Of("acme")
			if len(all) != 7 {
				t.Fatalf("%d attempts, want 7 (5 jobs, two of them twice):\n%s", len(all), arrivalList(all))
			}
			keys := ds.Keys()
			mu.Lock()
			defer mu.Unlock()
			if len(pushed) != 2 {
				t.Fatalf("%d jobs answered 429, want the burst's 2:\n%s", len(pushed), arrivalList(all))
			}
			var last429 time.Time
			for k, at := range pushed {
				if keys[k] != 2 {
					t.Fatalf("pushed-back job %s reached the downstream %d times, want 2 (the 429 and its resend, one key)", k, keys[k])
				}
				if at.After(last429) {
					last429 = at
				}
			}
			if testutil.Race {
				return // timing under the race detector says nothing (testutil.Race)
			}
			if v := downstreamtest.WindowViolation(all, T, 2); v != "" {
				t.Fatal(v)
			}
			// The burst's two went together; after the pause no burst: the
			// queue resumes at its spacing from the pause's end (no sooner
			// than a second after the last 429 arrived), the k-th attempt
			// after it k intervals later (a late write does not push the
			// next one back: invariant 1 with burst 2 allows that). Without
			// a window that holds for every attempt; with one, only for the
			// two resends: the window then holds the queue back, the
			// tenant is quiet, and may burst when the window frees.
			var after []downstreamtest.Arrival
			for _, a := range all {
				if a.At.After(last429) {
					after = append(after, a)
				}
			}
			// Five after the 429s when the burst went together; fewer when
			// the first 429 paused the tenant before the second went (a
			// busy machine), which then went after the pause and was
			// answered 429 in its turn.
			if len(after) == 0 {
				t.Fatalf("want the attempts after the last 429 to end the run:\n%s", arrivalList(all))
			}
			spaced := len(after)
			if c.n > 0 {
				spaced = min(2, spaced) // the resends
			}
			for k := range spaced {
				if earliest := last429.Add(time.Second + time.Duration(k)*T - downstreamtest.Jitter); after[k].At.Before(earliest) {
					t.Fatalf("attempt %d after the pause came %v after the last 429, want at least %v (a second, then %d intervals):\n%s",
						k, after[k].At.Sub(last429), time.Second+time.Duration(k)*T, k, arrivalList(all))
				}
			}
			for i := range all {
				for j := i + c.n; c.n > 0 && j < len(all); j++ {
					if span := all[j].At.Sub(all[i].At); span < c.length-downstreamtest.Jitter {
						t.Fatalf("%d attempts within %v, want at most %d in any %v:\n%s", j-i+1, span, c.n, c.length, arrivalList(all))
					}
				}
			}
		})
	}
}

// arrivalList is arrivals as lines, times from the first.
func arrivalList(all []downstreamtest.Arrival) string {
	var b strings.Builder
	for i, a := range all {
		b.WriteString("  +" + a.At.Sub(all[0].At).Round(10*time.Microsecond).String() + " key " + a.Key + " attempt " + a.Attempt)
		if i < len(all)-1 {
			b.WriteString("\n")
		}
	}
	return b.String()
}
