package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// hook is a client hook that calls cmd before each command the client
// sends on its own and pipeline before each pipeline or transaction (nil:
// nothing); an error from cmd fails the command without sending it.
type hook struct {
	cmd      func(goredis.Cmder) error
	pipeline func([]goredis.Cmder)
}

func (h hook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h hook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	if h.cmd == nil {
		return next
	}
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if err := h.cmd(cmd); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h hook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	if h.pipeline == nil {
		return next
	}
	return func(ctx context.Context, cmds []goredis.Cmder) error { h.pipeline(cmds); return next(ctx, cmds) }
}

// failReads fails the client's reads of hashes (HGETALL, HMGET) while it
// is armed; scripts and asynq's own commands pass.
type failReads struct{ armed atomic.Bool }

func (f *failReads) hook() goredis.Hook {
	return hook{cmd: func(cmd goredis.Cmder) error {
		if name := cmd.Name(); f.armed.Load() && (name == "hgetall" || name == "hmget") {
			return fmt.Errorf("%s refused by the test", name)
		}
		return nil
	}}
}

// openFake opens a store on a redis-server of the test's own, deciding on
// clk, with each tenant's downstream ceiling from ceiling (nil: none).
func openFake(t *testing.T, rdb *goredis.Client, clk clock.Clock, policy queue.PolicyFunc, ceiling queue.CeilingFunc) *Store {
	t.Helper()
	// Not a new Redis: the wait for an owner of a partition Redis never
	// saw (its jobs placed at the vacancy's end, on Redis's clock) is
	// cmd/throttler's TestNewRedisPromisesTheWaitForAnOwner.
	seenPartitions(t, rdb)
	s, err := Open(context.Background(), Options{Client: rdb, Clock: clk, Policy: policy, Ceiling: ceiling, StartLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// arrivalListed reports whether job id is in its partition's arrivals
// (its owner learns of it from there).
func arrivalListed(t *testing.T, s *Store, rdb *goredis.Client, id string) bool {
	t.Helper()
	part, ok := s.partOfID(id)
	if !ok {
		t.Fatalf("%q is not a job id of this store", id)
	}
	lines, err := rdb.LRange(context.Background(), keysOf(part).arrivals(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		if got, _, _, ok := parseArrival(line); ok && got == id {
			return true
		}
	}
	return false
}

// A batch whose admission script ran is durable. A repeated
// key's answer must not need a second read that can fail after the commit
// (the call would answer 503, the client would retry, and the key-less jobs
// of the batch would be admitted twice): the call succeeds, the repeat is
// answered as the first time, and its owner is told of every job admitted.
func TestRepeatIsAnsweredWithoutASecondRead(t *testing.T) {
	rdb := redisClient(t, 0)
	reads := &failReads{}
	rdb.AddHook(reads.hook())
	ctx := context.Background()
	s := openFake(t, rdb, clock.NewFake(queuetest.T0), queuetest.Leaky20(10), nil)
	keyed := queue.NewJob{Payload: []byte(`"k"`), IdempotencyKey: "k"}
	first, err := s.Enqueue(ctx, "acme", []queue.NewJob{keyed})
	if err != nil || !first[0].Admitted() {
		t.Fatalf("first use of the key: %+v %v", first, err)
	}

	reads.armed.Store(true)
	out, err := s.Enqueue(ctx, "acme", []queue.NewJob{queuetest.Payload(1), keyed, queuetest.Payload(2)})
	reads.armed.Store(false)
	if err != nil {
		t.Fatalf("Enqueue after its admission script ran: %v (the batch is durable: it must be answered)", err)
	}
	if !out[0].Admitted() || out[0].Duplicate || !out[2].Admitted() || out[2].Duplicate {
		t.Fatalf("key-less jobs: %+v, %+v; want both admitted", out[0], out[2])
	}
	r, f := out[1], first[0]
	if !r.Duplicate || r.Job.ID != f.Job.ID || r.ExpectedDelay != f.ExpectedDelay || r.QueueDepth != f.QueueDepth ||
		r.Job.State != queue.StateQueued || r.Job.Tenant != "acme" || !r.Job.EnqueuedAt.Equal(f.Job.EnqueuedAt) || r.Job.AdmitDelay != f.Job.AdmitDelay {
		t.Fatalf("the repeat: %+v\nwant the first answer again: %+v", r, f)
	}
	for _, a := range []queue.Admission{out[0], out[2]} {
		if !arrivalListed(t, s, rdb, a.Job.ID) {
			t.Errorf("job %s admitted, its partition's owner not told", a.Job.ID)
		}
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.Accepted != 3 || st.QueueDepth != 3 {
		t.Fatalf("status %+v %v, want 3 accepted and waiting", st, err)
	}
}

// On Redis too: any deadline given is a deadline, one at or before
// 1970 too (the scripts took 0 and below as none): a deadline already past
// is refused as would_expire, as the embedded store refuses it.
func TestDeadlineAtOrBefore1970IsADeadline(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	s := openFake(t, rdb, clock.NewFake(queuetest.T0), queuetest.Leaky20(10), nil)
	for _, deadline := range []time.Time{time.Unix(0, 0), time.Unix(-3600, 0), time.Unix(0, 1000), queuetest.T0.Add(-time.Second)} {
		out, err := s.Enqueue(ctx, "acme", []queue.NewJob{{Payload: []byte(`1`), Deadline: deadline}})
		if err != nil || out[0].Impossible == nil || out[0].Impossible.Reason != queue.ReasonWouldExpire || !out[0].Impossible.Deadline.Equal(deadline) {
			t.Fatalf("deadline %s: %+v %v, want would_expire", deadline.UTC().Format(time.RFC3339Nano), out[0], err)
		}
	}
	// A job with no deadline is kept, and never expires for want of one.
	out, err := s.Enqueue(ctx, "acme", []queue.NewJob{queuetest.Payload(1)})
	if err != nil || !out[0].Admitted() {
		t.Fatalf("no deadline: %+v %v", out, err)
	}
	if j, err := s.Job(ctx, out[0].Job.ID); err != nil || !j.Deadline.IsZero() {
		t.Fatalf("no deadline read back as %v %v", j.Deadline, err)
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.Accepted != 1 || st.QueueDepth != 1 {
		t.Fatalf("status %+v %v, want the one job without a deadline", st, err)
	}
}

// A retry refused in the script because the job is no longer failed (a
// concurrent retry took it first) names the job in its StateError.
func TestRetryRefusedInTheScriptNamesTheJob(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	clk := clock.NewFake(queuetest.T0)
	s := openFake(t, rdb, clk, queuetest.Leaky20(10), nil)
	a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1))
	if !a.Admitted() {
		t.Fatalf("enqueue: %+v", a)
	}
	id := a.Job.ID
	stop := queuetest.Consume(t, s, queue.DefaultLead, func(context.Context, queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Failed, Status: 400, Error: "no"}
	})
	waitJob(t, s, id, queue.StateFailed)
	stop()

	// Between Retry's read (failed) and its script, another retry takes
	// the job.
	k := keysOf(s.partOf("acme")).job(id)
	rdb.AddHook(beforeScript(func() { rdb.HSet(context.Background(), k, "state", "queued") }))
	_, err := s.Retry(ctx, id)
	var se *queue.StateError
	if !errors.As(err, &se) || se.ID != id || se.State != queue.StateQueued || !strings.Contains(err.Error(), id) {
		t.Fatalf("retry of a job retried meanwhile: %v, want a StateError naming job %s", err, id)
	}
}

// beforeScript runs f once, before the next script the client runs.
func beforeScript(f func()) goredis.Hook {
	var once atomic.Bool
	return hook{cmd: func(cmd goredis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && once.CompareAndSwap(false, true) {
			f()
		}
		return nil
	}}
}

// waitJob waits until job id is in state.
func waitJob(t *testing.T, s queue.Store, id string, state queue.JobState) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "job "+id+" "+string(state), func() bool {
		j, err := s.Job(context.Background(), id)
		return err == nil && j.State == state
	})
}
