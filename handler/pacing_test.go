package handler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// A Go handler is paced as an HTTP downstream is (DESIGN.md invariant 1,
// section 6d): the handler records the instant it starts, and one tenant's
// starts are at least T - 2 ms apart across 200 jobs, with retries (errors)
// and a pushback in the middle. Every job ends succeeded, a retried one
// after its error, and a job cancelled while it waits is never handed to
// the handler.
func TestHandlerStartsArePaced(t *testing.T) {
	testutil.SkipShort(t, "timing test: 200 jobs paced 40 ms apart")
	t.Parallel()
	const T = 40 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time
	calls := map[string]int{}         // job id -> calls
	startOf := map[time.Time]string{} // start -> job id and attempt
	mux := handler.NewMux()
	mux.HandleFunc("rec", func(ctx context.Context, job *handler.Job) ([]byte, error) {
		now := time.Now()
		mu.Lock()
		starts = append(starts, now)
		calls[job.ID]++
		first := calls[job.ID] == 1 // (job.Attempt counts a send released unsent at a pause too)
		startOf[now] = fmt.Sprintf("%s (payload %s, attempt %d)", job.ID, job.Payload, job.Attempt)
		mu.Unlock()
		var n int
		fmt.Sscanf(string(job.Payload), `{"n":%d}`, &n)
		switch {
		case n%25 == 7 && first:
			return nil, errors.New("vendor timeout") // retried
		case n == 100 && first:
			return nil, handler.Pushback(300*time.Millisecond, errors.New("slow down"))
		}
		return fmt.Appendf(nil, "sent %d", n), nil
	})
	base := start(t, writeConfig(t, fmt.Sprintf(`
[downstreams.rec]
handler = "rec"
timeout = "2s"
max_attempts = 3
[tenant_defaults]
downstream = "rec"
rate = "%d/s"
capacity = 400
`, int(time.Second/T))), mux)

	var jobs []string
	for n := range 200 {
		jobs = append(jobs, fmt.Sprintf(`{"payload": {"n":%d}}`, n))
	}
	ids := enqueueBatch(t, base, "acme", jobs)
	cancelled := ids[len(ids)-1] // due about 8 s from now
	if status, j := call(t, "DELETE", base+"/v1/jobs/"+cancelled, ""); status != http.StatusOK || j["state"] != "cancelled" {
		t.Fatalf("cancel: %d %v", status, j)
	}
	got := waitStates(t, base, ids, 20*time.Second)
	for i, id := range ids {
		want := "succeeded"
		if id == cancelled {
			want = "cancelled"
		}
		if got[id] != want {
			t.Fatalf("job %d ended %s, want %s", i, got[id], want)
		}
	}
	_, j := state(t, base, ids[7])
	if r, _ := j["response"].(map[string]any); r == nil || r["body"] != "sent 7" {
		t.Fatalf("job 7's response is %v, want the bytes its handler returned", j["response"])
	}

	mu.Lock()
	defer mu.Unlock()
	if calls[cancelled] != 0 {
		t.Fatalf("the cancelled job's handler was called %d times", calls[cancelled])
	}
	// 199 successes, 8 errors (n = 7, 32, ..., 182) and one pushback.
	if want := 199 + 8 + 1; len(starts) != want {
		var more []string
		for id, n := range calls {
			if n > 1 {
				more = append(more, fmt.Sprintf("%s: %d", id, n))
			}
		}
		t.Fatalf("%d calls, want %d; jobs called more than once: %v", len(starts), want, more)
	}
	slices.SortFunc(starts, time.Time.Compare)
	closest := time.Hour
	preempted := 0
	for i := 1; i < len(starts); i++ {
		gap := starts[i].Sub(starts[i-1])
		closest = min(closest, gap)
		if gap >= T-2*time.Millisecond {
			continue
		}
		// The gate stamps a call's start (sent_at) right before it makes
		// the call, in the same goroutine; the machine can still take the
		// CPU from it in between (a busy CI run: 3 ms, so two starts 36.7
		// ms apart whose stamps were 39.7 ms apart). Starts closer than
		// T - 2 ms pass only if the stamps of those same attempts were
		// not, and the earlier call started late after its stamp by the
		// shortfall or more; anything else is the gate's fault.
		var stamp [2]time.Time
		var last [2]bool
		for k, at := range starts[i-1 : i+1] {
			id, rest, _ := strings.Cut(startOf[at], " ")
			_, j := state(t, base, id)
			stamp[k], _ = time.Parse(time.RFC3339Nano, fmt.Sprint(j["sent_at"]))
			last[k] = strings.HasSuffix(rest, fmt.Sprintf("attempt %v)", j["attempts"]))
			t.Logf("job %s: started %s, sent_at %v", id, at.UTC().Format(time.RFC3339Nano), j["sent_at"])
		}
		lateStart := starts[i-1].Sub(stamp[0])
		if last[0] && last[1] && stamp[1].Sub(stamp[0]) >= T-2*time.Millisecond && gap+lateStart >= T-2*time.Millisecond {
			preempted++
			continue
		}
		t.Fatalf("calls %d and %d (jobs %s and %s) started %v apart, want at least T - 2 ms = %v",
			i-1, i, startOf[starts[i-1]], startOf[starts[i]], gap, T-2*time.Millisecond)
	}
	t.Logf("%d starts over %v, closest pair %v apart (T = %v); %d pairs closer only because the earlier call started late after its stamp",
		len(starts), starts[len(starts)-1].Sub(starts[0]), closest, T, preempted)
}
