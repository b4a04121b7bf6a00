package queuetest

// Caps on attempts in flight (DESIGN.md 6e): no job of a tenant at its
// cap, or of a downstream at its cap, is handed over until an attempt of
// it ends; the others go as before, and the capped backlog goes in order
// as places free.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// capsUnderTest: acme may have 2 attempts in flight; the tenants b1 to b3
// share their downstream's cap of 2; free has none.
func capsUnderTest(tenant string) queue.Caps {
	switch tenant {
	case "acme":
		return queue.Caps{Downstream: "sms", Tenant: 2, Timeout: time.Second}
	case "b1", "b2", "b3":
		return queue.Caps{Downstream: "bank", Shared: 2, Timeout: time.Second}
	}
	return queue.Caps{Downstream: "sms"}
}

// capsConfig is a store's config with capsUnderTest: each tenant's
// downstream named as its caps name it, none with a ceiling.
func capsConfig() Config {
	return Config{Policy: Leaky20(10), Caps: capsUnderTest,
		Ceiling: func(tenant string) (string, *leaky.Policy) { return capsUnderTest(tenant).Downstream, nil }}
}

// holding is a handler that keeps each attempt open until the test ends
// it, and counts what is open by scope.
type holding struct {
	clk     clock.Clock
	mu      sync.Mutex
	open    map[string]chan queue.Outcome // by job id
	handed  []queue.Job
	most    map[string]int // the most open at once, by scope
	current map[string]int
}

func newHolding(clk clock.Clock) *holding {
	return &holding{clk: clk, open: map[string]chan queue.Outcome{}, most: map[string]int{}, current: map[string]int{}}
}

func scopeOf(tenant string) string {
	if c := capsUnderTest(tenant); c.Shared > 0 {
		return "downstream:" + c.Downstream
	}
	return "tenant:" + tenant
}

func (h *holding) handle(ctx context.Context, j queue.Job) queue.Outcome {
	end := make(chan queue.Outcome, 1)
	scope := scopeOf(j.Tenant)
	h.mu.Lock()
	h.open[j.ID] = end
	h.handed = append(h.handed, j)
	h.current[scope]++
	h.most[scope] = max(h.most[scope], h.current[scope])
	h.mu.Unlock()
	var out queue.Outcome
	select {
	case out = <-end:
	case <-ctx.Done():
		out = queue.Outcome{Result: queue.Released}
	}
	h.mu.Lock()
	h.current[scope]--
	h.mu.Unlock()
	return out
}

// end ends the open attempt of job id with out.
func (h *holding) end(t *testing.T, id string, out queue.Outcome) {
	t.Helper()
	h.mu.Lock()
	end, ok := h.open[id]
	delete(h.open, id)
	h.mu.Unlock()
	if !ok {
		t.Fatalf("job %s is not open", id)
	}
	end <- out
}

// handedOf lists the jobs of tenants handed over so far, in order.
func (h *holding) handedOf(tenants ...string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for _, j := range h.handed {
		if slices.Contains(tenants, j.Tenant) {
			ids = append(ids, j.ID)
		}
	}
	return ids
}

func (h *holding) mostOpen(scope string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.most[scope]
}

// runClock moves the fake clock on by step until cond holds, each step
// once the store has handed over what was due (WaitHanded's pace).
func runClock(t *testing.T, clk *clock.Fake, got <-chan Handed, step time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s (the clock at %v)", what, clk.Now().Sub(T0))
		}
		select {
		case <-got:
		case <-time.After(2 * time.Millisecond):
			clk.Advance(step)
		}
	}
}

func testCapsHoldAttemptsInFlight(t *testing.T, d Driver) {
	clk, s, _ := d.startWith(t, capsConfig())
	acme := EnqueueN(t, s, "acme", 5)
	free := EnqueueN(t, s, "free", 5)
	var bank []string
	for _, b := range []string{"b1", "b2", "b3"} {
		bank = append(bank, EnqueueN(t, s, b, 2)...)
	}
	h := newHolding(clk)
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 64, h.handle)

	// Every job's time comes (the last at 200 ms): the tenant without a
	// cap sends all of its own; the capped ones, their caps' worth.
	runClock(t, clk, got, 10*time.Millisecond, "the uncapped tenant's 5 and each cap's 2 handed over", func() bool {
		return len(h.handedOf("free")) == 5 && len(h.handedOf("acme")) >= 2 && len(h.handedOf("b1", "b2", "b3")) >= 2
	})
	for range 20 { // the clock runs on: nothing more may go while they are open
		clk.Advance(50 * time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	if n, m := len(h.handedOf("acme")), len(h.handedOf("b1", "b2", "b3")); n != 2 || m != 2 {
		t.Fatalf("with 2 attempts open each, %d of acme's and %d of the bank's were handed over: the caps are 2", n, m)
	}
	if got := h.handedOf("acme"); !slices.Equal(got, acme[:2]) {
		t.Fatalf("acme's first two handed over: %v, want its first two jobs %v", got, acme[:2])
	}
	for _, id := range h.handedOf("free") {
		h.end(t, id, Succeed(clk)(context.Background(), queue.Job{}))
	}

	// Each attempt that ends lets the next of its scope go, in order.
	for i := 2; i < len(acme); i++ {
		h.end(t, acme[i-2], Succeed(clk)(context.Background(), queue.Job{}))
		runClock(t, clk, got, 10*time.Millisecond, fmt.Sprintf("acme's job %d handed over once one ended", i), func() bool {
			return len(h.handedOf("acme")) == i+1
		})
	}
	if got := h.handedOf("acme"); !slices.Equal(got, acme) {
		t.Fatalf("acme's jobs handed over in the order %v, want %v", got, acme)
	}
	ended := 0
	for len(h.handedOf("b1", "b2", "b3")) < len(bank) {
		h.end(t, h.handedOf("b1", "b2", "b3")[ended], Succeed(clk)(context.Background(), queue.Job{}))
		ended++
		runClock(t, clk, got, 10*time.Millisecond, "a bank job handed over once one ended", func() bool {
			return len(h.handedOf("b1", "b2", "b3")) == min(ended+2, len(bank))
		})
	}
	for _, id := range append(h.handedOf("acme")[3:], h.handedOf("b1", "b2", "b3")[ended:]...) {
		h.end(t, id, Succeed(clk)(context.Background(), queue.Job{}))
	}
	for _, id := range slices.Concat(acme, free, bank) {
		WaitState(t, s, id, queue.StateSucceeded)
	}
	if a, b := h.mostOpen("tenant:acme"), h.mostOpen("downstream:bank"); a != 2 || b != 2 {
		t.Fatalf("most open at once: acme %d, the bank's tenants %d; want 2 each (their caps)", a, b)
	}
}

// A retry is an attempt like any: the job that failed waits for a place
// like the others, and the cap holds through it.
func testCapsCountRetries(t *testing.T, d Driver) {
	clk, s, _ := d.startWith(t, capsConfig())
	acme := EnqueueN(t, s, "acme", 4)
	h := newHolding(clk)
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 64, h.handle)
	runClock(t, clk, got, 10*time.Millisecond, "acme's first two handed over", func() bool { return len(h.handedOf("acme")) == 2 })
	h.end(t, acme[0], queue.Outcome{Result: queue.Retry, Status: 500, Error: "500", SentAt: clk.Now(), NotBefore: clk.Now()})
	runClock(t, clk, got, 10*time.Millisecond, "a third attempt once the first failed", func() bool { return len(h.handedOf("acme")) == 3 })
	for range 20 {
		clk.Advance(50 * time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	if n := len(h.handedOf("acme")); n != 3 {
		t.Fatalf("%d attempts of acme handed over with 2 open: the cap is 2", n)
	}
	for done := 0; done < 20 && len(h.handedOf("acme")) > 0; done++ {
		h.mu.Lock()
		var open []string
		for id := range h.open {
			open = append(open, id)
		}
		h.mu.Unlock()
		if len(open) == 0 {
			break
		}
		for _, id := range open {
			h.end(t, id, Succeed(clk)(context.Background(), queue.Job{}))
		}
		runClock(t, clk, got, 10*time.Millisecond, "the rest go", func() bool {
			for _, id := range acme {
				if j, _ := s.Job(context.Background(), id); j.State != queue.StateSucceeded && !h.isOpen(id) {
					return false
				}
			}
			return true
		})
	}
	for _, id := range acme {
		WaitState(t, s, id, queue.StateSucceeded)
	}
	if m := h.mostOpen("tenant:acme"); m != 2 {
		t.Fatalf("most of acme's attempts open at once: %d, want 2", m)
	}
}

func (h *holding) isOpen(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.open[id]
	return ok
}

// A cap a reload sets counts the attempts already in flight: with two of
// a tenant open when it is capped at 2, nothing more of it goes until one
// of them ends.
func testCapsSetByAReloadCountWhatIsInFlight(t *testing.T, d Driver) {
	var capped atomic.Bool
	caps := func(tenant string) queue.Caps {
		if capped.Load() {
			return queue.Caps{Downstream: "sms", Tenant: 2, Timeout: time.Second}
		}
		return queue.Caps{Downstream: "sms"}
	}
	clk, s, _ := d.startWith(t, Config{Policy: Leaky20(10), Caps: caps,
		Ceiling: func(string) (string, *leaky.Policy) { return "sms", nil }})
	acme := EnqueueN(t, s, "acme", 5)
	h := newHolding(clk)
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 64, h.handle)
	runClock(t, clk, got, 10*time.Millisecond, "acme's first two handed over, uncapped", func() bool { return len(h.handedOf("acme")) >= 2 })
	capped.Store(true)
	if pl, ok := s.(queue.PolicyListener); ok {
		pl.PoliciesChanged() // as the service does at a reload
	}
	for range 20 { // every slot comes: nothing more may go while two are open
		clk.Advance(50 * time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	if n := len(h.handedOf("acme")); n != 2 {
		t.Fatalf("capped at 2 by a reload with 2 open, %d of acme's were handed over", n)
	}
	for i := 2; i < len(acme); i++ {
		h.end(t, acme[i-2], Succeed(clk)(context.Background(), queue.Job{}))
		runClock(t, clk, got, 10*time.Millisecond, fmt.Sprintf("acme's job %d once one ended", i), func() bool { return len(h.handedOf("acme")) >= i+1 })
	}
	for _, id := range acme[len(acme)-2:] {
		h.end(t, id, Succeed(clk)(context.Background(), queue.Job{}))
	}
	for _, id := range acme {
		WaitState(t, s, id, queue.StateSucceeded)
	}
	if m := h.mostOpen("tenant:acme"); m != 2 {
		t.Fatalf("most of acme's open at once: %d, want 2", m)
	}
}
