package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// T is the interval of the tests' usual tenant (20/s).
const T = 50 * time.Millisecond

// leaky20 is a leaky policy of 20/s and capacity for every tenant.
func leaky20(capacity int) queue.PolicyFunc {
	return func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 1, Capacity: capacity} }
}

// payload is a job whose payload says n.
func payload(n int) queue.NewJob {
	return queue.NewJob{Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// consume runs s.Consume in the background; the returned func stops it and
// waits for it to return (the test's end does too).
func consume(t *testing.T, s queue.Store, lead time.Duration, h queue.Handler) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Consume(ctx, h, queue.ConsumeOptions{Lead: lead, Concurrency: 16}) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
