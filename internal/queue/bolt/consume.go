package bolt

import (
	"cmp"
	"context"
	"math"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Consume implements queue.Store.
func (s *Store) Consume(ctx context.Context, h queue.Handler, opts queue.ConsumeOptions) error {
	lead := cmp.Or(opts.Lead, queue.DefaultLead)
	sem := make(chan struct{}, cmp.Or(opts.Concurrency, 1024))
	freed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if ctx.Err() != nil {
			return nil
		}
		// While awake, every enqueue pokes (the poke waits in the channel);
		// once asleep, only those due before the planned wake do.
		s.nextWake.Store(math.MaxInt64)
		now := s.clock.Now()
		var next time.Time
		if free := cap(sem) - len(sem); free > 0 {
			jobs, expired, n, err := s.claimDue(now.Add(lead), free)
			if err != nil {
				s.log.Error("dispatcher cannot read due jobs; trying again", "err", err)
				n = now.Add(time.Second)
			}
			s.expire(expired)
			next = n
			if len(jobs) > 0 {
				s.keepSendLease() // before any of them may be written
			}
			for _, j := range jobs {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.runHandler(ctx, h, j)
					<-sem
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
		}
		if len(sem) > 0 {
			s.keepSendLease() // while sends are in flight
		}
		// Sleep until the next job is well within the lead (so one pass
		// takes many jobs), something is enqueued that is due sooner, a
		// handler frees a place, or the poll interval passes.
		wait := time.Second
		var full <-chan struct{} // a freed place matters only when none was left
		if len(sem) == cap(sem) {
			full = freed
		} else if !next.IsZero() {
			wait = min(wait, next.Add(-lead+claimEvery).Sub(now))
		}
		// The wake is an instant, not a wait from now: the pass above may
		// have taken a while (a busy machine; a fake clock moved), and a
		// wait would wake that much late.
		wakeAt := now.Add(max(wait, time.Millisecond))
		s.nextWake.Store(wakeAt.UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-full:
		case <-clock.AfterAt(s.clock, wakeAt):
		}
	}
}

func (s *Store) runHandler(ctx context.Context, h queue.Handler, j queue.Job) {
	o := h(queue.WithSendCheck(ctx, s.mayWrite), j)
	// The outcome must be recorded before the job is let go: until then it
	// stays held (not sent again, not cancellable). Keep trying through a
	// passing failure; once the service is stopping, give up after a few
	// tries: the job is still waiting on disk and a restart sends it again
	// with the same Idempotency-Key.
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := s.finish(j, o)
		if err == nil {
			return
		}
		s.log.Error("cannot record the outcome of an attempt; trying again", "job", j.ID, "err", err)
		if (ctx.Err() != nil && attempt >= 5) || s.isClosing() {
			return
		}
		select {
		case <-time.After(backoff):
		case <-s.stop:
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
