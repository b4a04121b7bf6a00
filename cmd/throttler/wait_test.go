package main

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/redistest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// GET /v1/jobs/{id}?wait (DESIGN.md 6b) answers as soon as the job is in a
// final state (told by the store), and after the wait with the job as it is
// then while it is still being sent; a cancel ends a wait too. On the
// embedded store, and on Redis with the API process that waits apart from
// the worker that writes the final state (the notice crosses processes).
func TestJobWaitAnswersWhenTheJobEnds(t *testing.T) {
	t.Parallel()
	const tenants = "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 10\n[tenants.slow]\nrate = \"1/h\"\ncapacity = 10\n"
	t.Run("Embedded", func(t *testing.T) {
		t.Parallel()
		ds := downstreamtest.New(t)
		release := holdAnswers(t, ds)
		base := startServer(t, writeConfig(t, tenants, ds))
		checkJobWait(t, base, ds, release)
	})
	t.Run("Redis", func(t *testing.T) {
		testutil.SkipShort(t, "process test: throttler processes on a redis-server")
		t.Parallel()
		srv := redistest.Start(t, false)
		ds := downstreamtest.New(t)
		release := holdAnswers(t, ds)
		file := redisConfig(t, srv.URL(), "standalone", tenants, ds)
		api := startProcess(t, file, "--role", "api")
		startProcess(t, file, "--role", "worker")
		checkJobWait(t, api.base, ds, release)
	})
}

// holdAnswers makes ds hold every answer until release is called (at the
// test's end at the latest, so that ds can close).
func holdAnswers(t *testing.T, ds *downstreamtest.Server) (release func()) {
	gate := make(chan struct{})
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		<-gate
		w.WriteHeader(http.StatusOK)
	})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

func checkJobWait(t *testing.T, base string, ds *downstreamtest.Server, release func()) {
	for _, bad := range []string{"abc", "61s", "-1s"} {
		if st, _, body := call(t, "GET", base+"/v1/jobs/nosuchjob?wait="+bad, ""); st != http.StatusBadRequest || body["error"] != "invalid_wait" {
			t.Fatalf("?wait=%s: %d %v, want 400 invalid_wait", bad, st, body)
		}
	}
	id := enqueueN(t, base, "acme", 1)[0]
	testutil.WaitFor(t, 20*time.Second, "the job at the downstream, its answer held", func() bool { return len(ds.All()) == 1 })

	// Still being sent: answered after the wait, as it is then.
	asked := time.Now()
	st, _, j := call(t, "GET", base+"/v1/jobs/"+id+"?wait=300ms", "")
	if took := time.Since(asked); st != http.StatusOK || j["state"] != "dispatching" || took < 300*time.Millisecond {
		t.Fatalf("?wait=300ms on a job being sent: %d %v after %v, want 200 dispatching after 300ms", st, j, took)
	}

	// Waiting when it ends: answered at once, by the store's notice (the
	// conformance suite's FinalStatesTellTheirWatchers shows each store
	// tells), not by the wait's reread every second.
	type answer struct {
		asked, at time.Time
		st        int
		body      map[string]any
	}
	waitFor := func(id string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			asked := time.Now()
			st, _, body := call(t, "GET", base+"/v1/jobs/"+id+"?wait=20s", "")
			ch <- answer{asked, time.Now(), st, body}
		}()
		return ch
	}
	got := waitFor(id)
	nothingMoreWithin(200 * time.Millisecond)
	select {
	case a := <-got:
		t.Fatalf("?wait answered before the job ended: %d %v", a.st, a.body)
	default:
	}
	released := time.Now()
	release()
	a := <-got
	if a.st != http.StatusOK || a.body["state"] != "succeeded" {
		t.Fatalf("?wait when the job succeeded: %d %v", a.st, a.body)
	}
	checkAnsweredByTheNotice(t, "succeeded", a.asked, a.at, released, a.body)

	// A cancel is a final state too: a waiting job of a tenant at 1/h.
	enqueueN(t, base, "slow", 1)
	waiting := enqueueN(t, base, "slow", 1)[0]
	got = waitFor(waiting)
	nothingMoreWithin(200 * time.Millisecond)
	cancelling := time.Now()
	if st, _, body := call(t, "DELETE", base+"/v1/jobs/"+waiting, ""); st != http.StatusOK {
		t.Fatalf("cancel: %d %v", st, body)
	}
	a = <-got
	if a.st != http.StatusOK || a.body["state"] != "cancelled" {
		t.Fatalf("?wait when the job was cancelled: %d %v", a.st, a.body)
	}
	checkAnsweredByTheNotice(t, "cancelled", a.asked, a.at, cancelling, a.body)
}

// checkAnsweredByTheNotice: the wait's answer came before the server's
// reread (every second from when it read the job, after asked) could
// have given it, so the store's notice gave it. Not a bound on the
// machine's speed: the job ends about 200 ms into the wait, and the
// answer has the rest of the second. How soon it came after the test
// ended the job (ended) and after the job's finished_at (stamped in the
// write, before the write is durable and the notice goes) is logged:
// figures for RELIABILITY.md.
func checkAnsweredByTheNotice(t *testing.T, what string, asked, at, ended time.Time, job map[string]any) {
	t.Helper()
	fin, err := time.Parse(time.RFC3339Nano, job["finished_at"].(string))
	if err != nil {
		t.Fatalf("finished_at %v: %v", job["finished_at"], err)
	}
	if !at.Before(asked.Add(time.Second)) {
		t.Fatalf("?wait answered %v after it was asked, %v after the test ended the job (%s), want before the 1s reread: the store's notice did not reach it", at.Sub(asked), at.Sub(ended), what)
	}
	t.Logf("?wait answered %v after the test ended the job (%s), %v after its finished_at", at.Sub(ended), what, at.Sub(fin))
}
