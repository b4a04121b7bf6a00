package queue

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func boltOpener(t *testing.T) backend {
	path := filepath.Join(t.TempDir(), "throttler.db")
	return func(t *testing.T, clk clock.Clock, policy PolicyFunc) Store {
		t.Helper()
		s, err := OpenBolt(path, BoltOptions{Clock: clk, Policy: policy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func TestBoltConformance(t *testing.T) { runConformance(t, boltOpener) }

func TestBoltFileInUse(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.db")
	policy := leaky20(1)
	s, err := OpenBolt(path, BoltOptions{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = OpenBolt(path, BoltOptions{Policy: policy})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v", err)
	}
}

// Many concurrent enqueues share fsyncs and never oversubscribe a slot.
func TestBoltConcurrentEnqueue(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := boltOpener(t)(t, clk, func(string) leaky.Policy { return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 500} })
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := map[time.Time]bool{}
	admitted := 0
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				out, err := s.Enqueue(context.Background(), "t", []NewJob{payload(i)})
				if err != nil {
					t.Error(err)
					return
				}
				if out[0].Rejected == nil {
					mu.Lock()
					if slots[out[0].Job.DispatchAt] {
						t.Errorf("slot %v given twice", out[0].Job.DispatchAt)
					}
					slots[out[0].Job.DispatchAt] = true
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 501 {
		t.Fatalf("admitted %d of 1280 at capacity 500, want 501", admitted)
	}
	st, _ := s.Tenant(context.Background(), "t")
	if st.QueueDepth != 501 || st.Rejected != 1280-501 {
		t.Fatalf("status %+v", st)
	}
}

func TestBoltReapsFinishedJobsAfterRetention(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := boltOpener(t)(t, clk, leaky20(10)).(*BoltStore)
	ctx := context.Background()
	a := enqueueOne(t, s, "acme", NewJob{Payload: []byte(`1`), IdempotencyKey: "k"})
	if _, err := s.Cancel(ctx, a.Job.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.reap(clk.Now().Add(-time.Hour), 100); err != nil || n != 0 {
		t.Fatalf("reaped %d before retention (%v)", n, err)
	}
	clk.Advance(2 * time.Hour)
	if n, err := s.reap(clk.Now().Add(-time.Hour), 100); err != nil || n != 1 {
		t.Fatalf("reaped %d after retention (%v)", n, err)
	}
	if _, err := s.Job(ctx, a.Job.ID); err == nil {
		t.Fatal("reaped job still there")
	}
	// Its idempotency key is free again.
	b := enqueueOne(t, s, "acme", NewJob{Payload: []byte(`1`), IdempotencyKey: "k"})
	if b.Duplicate || b.Job.ID == a.Job.ID {
		t.Fatalf("key not freed: %+v", b)
	}
}

func TestBoltForgetsIdleTenants(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	s := boltOpener(t)(t, clk, leaky20(10)).(*BoltStore)
	enqueueOne(t, s, "acme", payload(1))
	got := make(chan handed, 1)
	stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
		got <- handed{j, clk.Now()}
		return Outcome{Result: Succeeded, Status: 200}
	})
	waitHanded(t, clk, got, time.Millisecond)
	stop()
	clk.Advance(time.Second)
	if err := s.flushDirty(); err != nil {
		t.Fatal(err)
	}
	s.evictIdle()
	s.mu.Lock()
	n := len(s.tenants)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d tenants still in memory", n)
	}
	st, _ := s.Tenant(context.Background(), "acme")
	if st.Accepted != 1 || st.Delivered != 1 {
		t.Fatalf("counters lost with eviction: %+v", st)
	}
}
