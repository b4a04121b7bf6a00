package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttler-dev/throttler/client"
)

// retry is how enqueue waits: the client's Retry-After jitter and
// backoff.
var retry = client.RetryPolicy{}

// send enqueues every item, in order, honouring Retry-After, paced by
// --rate or, without it, by the answers' RateLimit fields.
func send(ctx context.Context, c *client.Client, o options, items []*item, pace time.Duration, s *summary, p *progress) error {
	sn := &sender{c: c, o: o, pace: pace, s: s, p: p, pending: items, window: o.batch, room: -1}
	if pace == 0 {
		sn.room = 1 // nothing known of the tenant yet: one job asks
	}
	for len(sn.pending) > 0 {
		now, err := sn.waitForFront(ctx)
		if err != nil {
			return err
		}
		batch := sn.nextBatch(now)
		s.Requests++
		b, err := c.EnqueueBatch(ctx, o.tenant, jobsOf(batch))
		if err != nil {
			if err := sn.requestFailed(ctx, batch, err); err != nil {
				return err
			}
			continue
		}
		sn.failures = 0
		sn.answered(batch, b.Results)
		sn.paceBy(b.RateLimit)
	}
	return nil
}

// sender is one run of send: the jobs still to send and the pacing state.
type sender struct {
	c    *client.Client
	o    options
	pace time.Duration // --rate's interval (0: paced by RateLimit)
	s    *summary
	p    *progress

	pending   []*item   // in file order, those told to wait first
	nextPaced time.Time // when --rate, or the RateLimit fields, let the next job go
	failures  int       // requests failed in a row (not jobs refused)
	// window is how many jobs go in the next request. After a 429 it shrinks
	// to what the last request got in (at least one), so the jobs behind do
	// not spend their attempts being refused with the front; when a request
	// gets everything in, it doubles, up to --batch.
	window int
	// room is how many jobs the last answer's RateLimit fields said the
	// tenant has room for (-1: no word, or --rate paces).
	room int64
}

// maxPaceWait is the longest wait the RateLimit fields make enqueue take
// before sending. A longer one is not waited out unasked: the next job is
// sent, and its 429 and --max-attempts decide (a run with --max-attempts 1
// then ends at once, as it would have without the fields).
const maxPaceWait = time.Minute

// paceBy takes the RateLimit fields of an answer, without --rate: the next
// request carries at most the room they say is left, and when none is left
// it waits until more is (then one job asks how much). An answer without
// them leaves the pacing to Retry-After.
func (sn *sender) paceBy(rl client.RateLimit) {
	if sn.pace > 0 {
		return
	}
	n, wait := rl.Next()
	switch {
	case n < 0:
		sn.room = -1
	case n > 0:
		sn.room = n
	case wait > maxPaceWait:
		sn.room = 1
	default:
		sn.room = 1
		sn.nextPaced = time.Now().Add(wait + retry.Jitter(wait))
	}
}

// waitForFront waits until the first pending job may go (its Retry-After,
// and the pacing) and returns the time then. The first pending job goes
// first: later lines never overtake an earlier one that was told to wait.
func (sn *sender) waitForFront(ctx context.Context) (time.Time, error) {
	now := time.Now()
	wait := max(sn.pending[0].notBefore.Sub(now), sn.nextPaced.Sub(now))
	if wait <= 0 {
		return now, nil
	}
	sn.p.set(func(st *progressState) { st.waiting = true })
	if err := sleep(ctx, wait); err != nil {
		return time.Time{}, err
	}
	sn.p.set(func(st *progressState) { st.waiting = false })
	return time.Now(), nil
}

// nextBatch takes the jobs of the next request from the front of pending:
// at most window, those the pacing lets go by now, and none that must
// still wait. Each gets an attempt.
func (sn *sender) nextBatch(now time.Time) []*item {
	n := min(len(sn.pending), sn.window)
	if sn.room >= 0 && sn.room < int64(n) {
		n = max(1, int(sn.room)) // with no room, one job asks (after the wait)
	}
	if pace := sn.pace; pace > 0 {
		// Paced: one job every pace, and no credit for idle time beyond
		// one interval; send those due by now together.
		if sn.nextPaced.Before(now.Add(-pace)) {
			sn.nextPaced = now
		}
		due := 1 + int(now.Sub(sn.nextPaced)/pace)
		n = min(n, max(1, due))
		sn.nextPaced = sn.nextPaced.Add(time.Duration(n) * pace)
	}
	for i := 1; i < n; i++ { // stop at a job that must still wait
		if sn.pending[i].notBefore.After(now) {
			n = i
			break
		}
	}
	batch := sn.pending[:n]
	for _, it := range batch {
		it.attempts++
	}
	return batch
}

func jobsOf(batch []*item) []client.Job {
	jobs := make([]client.Job, len(batch))
	for i, it := range batch {
		jobs[i] = it.job
	}
	return jobs
}

// requestFailed handles a request that got no per-job answers: nil means
// send the batch again (after a backoff, already waited); otherwise the
// run ends with the error returned.
func (sn *sender) requestFailed(ctx context.Context, batch []*item, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ae *client.APIError
	switch {
	case client.IsUnreachable(err), errors.As(err, &ae) && (ae.Status >= 500 || ae.Status == 429):
		sn.failures++
		if sn.failures >= sn.o.maxAttempts {
			code := exitUnreachable
			if ae != nil {
				code = exitRefused
			}
			return exitError{code: code, err: fmt.Errorf("%v (gave up after %d tries)", err, sn.failures)}
		}
		backoff := retry.Backoff(sn.failures)
		if ae != nil && ae.RetryAfter > 0 {
			backoff = max(backoff, ae.RetryAfter)
		}
		for _, it := range batch {
			it.attempts-- // the request, not the job, failed
		}
		sn.p.set(func(st *progressState) { st.retrying = len(batch); st.lastErr = err.Error() })
		return sleep(ctx, backoff)
	case errors.As(err, &ae) && (ae.Status == 400 || ae.Status == 413):
		return exitError{code: exitBadInput, err: fmt.Errorf("server refused lines %d-%d: %v", batch[0].line, batch[len(batch)-1].line, err)}
	}
	return err
}

// answered records the per-job answers of a request, resizes the window,
// and puts the jobs told to wait back at the front, after their
// Retry-After plus jitter (so that clients told the same instant do not
// come back together).
func (sn *sender) answered(batch []*item, results []client.Result) {
	again, longest, got := sn.tally(batch, results)
	if len(again) > 0 {
		sn.window = max(1, got)
		sn.s.Waits++
		at := time.Now().Add(longest + retry.Jitter(longest))
		for _, it := range again {
			it.notBefore = at
		}
	} else {
		sn.window = min(sn.o.batch, 2*sn.window)
	}
	sn.pending = append(again, sn.pending[len(batch):]...)
	s := sn.s
	sn.p.set(func(st *progressState) {
		st.accepted, st.rejected, st.retrying, st.lastErr = s.Accepted, s.Rejected, len(again), ""
	})
}

// tally counts each job's answer: again are the jobs refused for now (429)
// with attempts left, longest their longest Retry-After, got how many got in.
func (sn *sender) tally(batch []*item, results []client.Result) (again []*item, longest time.Duration, got int) {
	s := sn.s
	for i, r := range results {
		it := batch[i]
		it.result = r
		switch r.Status {
		case 200, 202:
			it.accepted = true
			got++
			s.Accepted++
			if r.Status == 200 {
				s.Duplicates++
			}
			if r.Admission.Scheduled() {
				s.Scheduled++
			}
		case 429:
			s.Refusals++
			var full *client.ScheduleFullError
			if errors.As(r.Err, &full) {
				// No Retry-After: room comes only as the tenant's booked
				// jobs reach their slots, which may be days ahead.
				it.given = true
				s.Rejected++
				s.Impossible++
				continue
			}
			if it.attempts >= sn.o.maxAttempts {
				it.given = true
				s.Rejected++
				continue
			}
			var ae *client.APIError
			if errors.As(r.Err, &ae) {
				longest = max(longest, ae.RetryAfter)
			}
			again = append(again, it)
		default:
			it.given = true
			s.Rejected++
			if r.Status == 422 {
				s.Impossible++ // would expire, costs more than the bucket holds, too far ahead: retrying cannot help
			}
		}
	}
	return again, longest, got
}

// waitDelivered waits for each accepted job to finish, in the order sent
// (about the order they finish in), one long poll at a time (WaitJob: GET
// /v1/jobs/{id}?wait): the server answers as soon as a job ends, and at
// once for one that has ended already, so a run of n jobs asks about n
// times instead of polling every job every 250 ms.
func waitDelivered(ctx context.Context, c *client.Client, o options, items []*item, s *summary, p *progress) error {
	deadline := time.Now().Add(o.waitTimeout)
	open := make([]*item, 0, len(items))
	for _, it := range items {
		if it.accepted {
			open = append(open, it)
		}
	}
	p.set(func(st *progressState) { st.phase = "delivering"; st.total = len(open) })
	for i, it := range open {
		j, err := waitOne(ctx, c, it.result.Admission.ID, deadline)
		if err != nil {
			return err
		}
		if !j.Finished() && j.State != "unknown" {
			s.Undelivered = len(open) - i // --wait-timeout passed
			return nil
		}
		it.final = j
		switch j.State {
		case "succeeded":
			s.Delivered++
		case "unknown":
		default:
			s.Failed++
		}
		p.set(func(st *progressState) { st.delivered, st.failed = s.Delivered, s.Failed })
	}
	return nil
}

// waitOne waits for job id to finish, until deadline, asking again after a
// passing error. A job the server no longer knows is state "unknown".
func waitOne(ctx context.Context, c *client.Client, id string, deadline time.Time) (client.JobStatus, error) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return client.JobStatus{State: "waiting"}, nil
		}
		j, err := c.WaitJob(ctx, id, left)
		var nf *client.NotFoundError
		switch {
		case ctx.Err() != nil:
			return j, ctx.Err()
		case err == nil:
			return j, nil
		case errors.As(err, &nf):
			return client.JobStatus{State: "unknown"}, nil
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil { // a passing error: ask again
			return j, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
