package bolt

import (
	"cmp"
	"sync/atomic"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// maxStartLag caps how far the measured start of a send moves schedules.
const maxStartLag = 100 * time.Millisecond

// startLag estimates how long a job that could go at once takes to reach
// the downstream, from its decision: a prompt job is due that much after
// it, so that its promise is true and the jobs queued behind it do not
// inherit its lateness. It has two parts, measured apart because they move
// apart:
//
//   - the wait for the admission to be durable. A call alone waits for one
//     commit (alone); each call being committed ahead of it adds its share
//     of the commits before (perAhead). A burst of 32 batches at once
//     waits 25 ms here where one call alone waits 1.5 ms, so the wait is
//     predicted from the calls in flight now, not from the last calls'
//     waits, which a burst outruns.
//   - the hand-over to the dispatcher and the write, once the admission is
//     durable (send, measured on prompt first attempts).
//
// An estimate too long only makes a prompt job wait at the gate for its
// slot; one too short makes it late, and its tenant's queue with it. So
// the promise is not the average but the average and a margin for its
// spread (as TCP times a retransmission from a round trip's average and
// deviation): aimed at the average, every other prompt job would be late.
type startLag struct {
	// durable-to-write of a prompt first attempt; the durable wait of a
	// call with none ahead of it; what each call ahead added to the wait
	// (not measured yet: taken as alone's).
	send, alone, perAhead spread
	// admitting counts Enqueue calls decided and not yet durable (nor
	// failed).
	admitting atomic.Int64

	// durable is when each prompt job's admission was durable, until its
	// first attempt is measured (s.mu held); order lets entries no
	// attempt came for (a job cancelled before its send) go after a while.
	durable map[string]time.Time
	order   []durableAt
}

type durableAt struct {
	id string
	at time.Time
}

// forgetDurableAfter: a prompt job whose first attempt has not been
// measured this long after its admission will not be (observe takes none
// that started later than maxStartLag).
const forgetDurableAfter = 10 * maxStartLag

// estimate is the start lag of a call decided now, and the calls it will
// wait with (ahead: to be told to durableCall).
func (l *startLag) estimate() (lag time.Duration, ahead int64) {
	ahead = l.admitting.Load()
	perAhead := cmp.Or(l.perAhead.high(), l.alone.high())
	return min(l.send.high()+l.alone.high()+time.Duration(ahead)*perAhead, maxStartLag), ahead
}

// deciding counts a call that goes to be committed; durableCall or failed
// ends it.
func (l *startLag) deciding() { l.admitting.Add(1) }

func (l *startLag) failed() { l.admitting.Add(-1) }

// durableCall ends a call decided at decidedAt with ahead others in flight,
// durable at now, and keeps when its prompt jobs became durable (s.mu held).
func (l *startLag) durableCall(decidedAt, now time.Time, ahead int64, jobs []queue.Job) {
	l.admitting.Add(-1)
	wait := now.Sub(decidedAt)
	if ahead == 0 {
		l.alone.add(wait)
	} else {
		l.perAhead.add(max(0, wait-time.Duration(l.alone.avg.Load())) / time.Duration(ahead))
	}
	for _, j := range jobs {
		if j.Prompt {
			l.durable[j.ID] = now
			l.order = append(l.order, durableAt{j.ID, now})
		}
	}
	for len(l.order) > 0 && now.Sub(l.order[0].at) > forgetDurableAfter {
		delete(l.durable, l.order[0].id) // none if measured already
		l.order = l.order[1:]
	}
}

// observe feeds the send part with a prompt first attempt handed to the
// dispatcher at handedAt (s.mu held). The sample is the pipeline's own
// overhead, not the lag it schedules with (the dispatcher waits for the
// slot, so enqueue-to-send holds the lag itself and would only grow if fed
// back): durable-to-hand-over, plus the write's delay after the later of
// the hand-over and the slot (the gate, the connection).
func (l *startLag) observe(j queue.Job, handedAt time.Time) {
	durable, ok := l.durable[j.ID]
	delete(l.durable, j.ID)
	if !ok || !j.Prompt || j.Attempts != 1 || j.SentAt.IsZero() || handedAt.IsZero() {
		return
	}
	if handedAt.Sub(j.EnqueuedAt) >= maxStartLag || !j.DispatchAt.Equal(j.EnqueuedAt.Add(j.AdmitDelay)) {
		// Not the pipeline's overhead: a job sent again after a crash, a
		// failed job retried long after its enqueue, or one whose time
		// moved after its admission (a pause, a restart).
		return
	}
	ready := clock.Later(handedAt, j.DispatchAt)
	l.send.add(max(0, handedAt.Sub(durable)) + max(0, j.SentAt.Sub(ready)))
}

// average moves a moving average an eighth of the way to sample.
func average(avg *atomic.Int64, sample time.Duration) {
	for {
		old := avg.Load()
		if avg.CompareAndSwap(old, old+(int64(sample)-old)/8) {
			return
		}
	}
}

// spread is a moving average of a time and of its deviation from it (ns).
type spread struct{ avg, dev atomic.Int64 }

// spreadMargin: how many deviations past the average a promise is made.
// Three cover nearly every sample of a steady pipeline; a burst is what
// the calls ahead are counted for.
const spreadMargin = 3

func (s *spread) add(sample time.Duration) {
	avg := time.Duration(s.avg.Load())
	average(&s.dev, max(sample-avg, avg-sample))
	average(&s.avg, sample)
}

func (s *spread) high() time.Duration {
	return time.Duration(s.avg.Load() + spreadMargin*s.dev.Load())
}

func (s *spread) take() int64 { return s.avg.Swap(0) + s.dev.Swap(0) }

// take reports the estimate's parts and resets them (the model test: on
// its fake clock all stay zero).
func (l *startLag) take() time.Duration {
	return time.Duration(l.send.take() + l.alone.take() + l.perAhead.take())
}
