package handler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/handler"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// A Go handler is paced as an HTTP downstream is (DESIGN.md invariant 1,
// section 6d): the handler records the start throttler recorded for its
// call (Job.Started), and one tenant's starts are at least T - 2 ms apart
// across 200 jobs, with retries (errors) and a pushback in the middle; no
// call runs before its Started. Every job ends succeeded, a retried one
// after its error, and a job cancelled while it waits is never handed to
// the handler.
func TestHandlerStartsArePaced(t *testing.T) {
	testutil.SkipShort(t, "timing test: 200 jobs paced 40 ms apart")
	t.Parallel()
	const T = 40 * time.Millisecond
	var mu sync.Mutex
	var starts, entered []time.Time // Job.Started, and the handler's own clock
	var early []string
	calls := map[string]int{}         // job id -> calls
	startOf := map[time.Time]string{} // start -> job id and attempt
	mux := handler.NewMux()
	mux.HandleFunc("rec", func(ctx context.Context, job *handler.Job) ([]byte, error) {
		now := time.Now()
		mu.Lock()
		if job.Started.IsZero() || now.Before(job.Started) {
			early = append(early, fmt.Sprintf("%s ran at %v, Started %v", job.ID, now, job.Started))
		}
		entered = append(entered, now)
		now = job.Started
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
	if len(early) > 0 {
		t.Fatalf("calls before the start throttler recorded: %v", early)
	}
	slices.SortFunc(starts, time.Time.Compare)
	closest := time.Hour
	for i := 1; i < len(starts); i++ {
		gap := starts[i].Sub(starts[i-1])
		closest = min(closest, gap)
		if gap < T-2*time.Millisecond {
			t.Fatalf("calls %d and %d (jobs %s and %s) started %v apart, want at least T - 2 ms = %v",
				i-1, i, startOf[starts[i-1]], startOf[starts[i]], gap, T-2*time.Millisecond)
		}
	}
	// The handler's own clock: a busy machine may take the CPU between
	// the recorded start and the handler's first line (logged, not judged).
	slices.SortFunc(entered, time.Time.Compare)
	closestEntered := time.Hour
	for i := 1; i < len(entered); i++ {
		closestEntered = min(closestEntered, entered[i].Sub(entered[i-1]))
	}
	t.Logf("%d starts over %v, closest pair %v apart (T = %v); by the handler's own clock %v",
		len(starts), starts[len(starts)-1].Sub(starts[0]), closest, T, closestEntered)
}
