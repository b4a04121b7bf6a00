package dispatch

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// classify turns what an attempt's send came to into the job's outcome and
// the answer's class (2xx, 3xx, 4xx, 429, 5xx, timeout, connection_error;
// "" if nothing was sent), and tells the breaker how the downstream did.
// probe says the attempt was the breaker's half-open probe.
func (d *Dispatcher) classify(job queue.Job, r Route, br *breaker, probe bool, s sent) (queue.Outcome, string) {
	now := d.clock.Now()
	switch {
	case s.err != nil && s.at.IsZero() && s.refused != nil:
		// The gate let nothing be written: says nothing of the downstream.
		br.report(now, probe, unsent)
		return unsentOutcome(s.refused), ""
	case s.err != nil:
		what, class := "connection error", "connection_error"
		if s.timedOut {
			what, class = fmt.Sprintf("timeout after %v", r.Timeout), "timeout"
		}
		if s.at.IsZero() {
			class = "connection_error" // nothing was written
		}
		if tp := tlsProblem(s.err, r); tp != "" {
			what += ": " + tp // a TLS failure is a connection error, said so
		}
		return d.failure(job, r, br, probe, queue.Outcome{SentAt: s.at}, now, fmt.Sprintf("%s: %v", what, unwrapURL(s.err))), class
	}
	return d.classifyAnswer(job, r, br, probe, s, now)
}

// unsentOutcome is the outcome of an attempt the gate let write nothing,
// for the reason refused: no attempt is used up.
func unsentOutcome(refused error) queue.Outcome {
	var held *HeldError
	switch {
	case errors.Is(refused, errExpired):
		return queue.Outcome{Result: queue.Expired}
	case errors.As(refused, &held) && held.Busy:
		// Busy for now (a full window, the shared gate's backlog): back in
		// line, not before then.
		return queue.Outcome{Result: queue.Released, NotBefore: held.Until, Error: held.Error()}
	case held != nil && held.Until.Before(clock.Never):
		// Paused while it waited for its slot: it goes back in line behind
		// the job that was pushed back.
		return queue.Outcome{Result: queue.Released, PauseUntil: held.Until}
	default:
		// The store holds the tenant (an operator's pause), or the service
		// is stopping: back in line as it was.
		return queue.Outcome{Result: queue.Released}
	}
}

// classifyAnswer classifies the downstream's answer (DESIGN.md invariant 6):
// 2xx succeeded; 429, and 503 with Retry-After, push the tenant back (a 429
// without Retry-After waits for the reset its rate limit fields announce,
// if they are read); other 5xx and 408 are failures, retried; redirects
// and other 4xx fail the job.
func (d *Dispatcher) classifyAnswer(job queue.Job, r Route, br *breaker, probe bool, s sent, now time.Time) (queue.Outcome, string) {
	st, body := s.answer.status, s.answer.body
	out := queue.Outcome{SentAt: s.at, Status: st, Response: s.answer.kept}
	wait, hasWait := retryAfter(s.answer.retryAfter, now)
	announced, capped, exhausted := announcedWait(r, s.answer)
	switch {
	case !exhausted:
	case st == http.StatusTooManyRequests && !hasWait:
		// A refusal that says when in its rate limit fields only.
		wait, hasWait = announced, true
		d.tellAnnounced(job, announced, capped)
	case st != http.StatusTooManyRequests && !(st == http.StatusServiceUnavailable && hasWait):
		// Taken, or refused for another reason (a 503 without
		// Retry-After stays a failure), with no room left: the sends
		// behind it wait for the reset instead of being refused.
		until := now.Add(announced)
		d.holdTenant(job, r, until)
		if r.AnnounceDownstream {
			d.holdDownstream(r, until)
		}
		d.tellAnnounced(job, announced, capped)
	}
	// A pushback whose answer says the account has no room left holds
	// every tenant of it when the announcements are scoped so.
	accountOut := exhausted && r.AnnounceDownstream
	switch {
	case st >= 200 && st < 300:
		br.report(now, probe, healthy)
		out.Result = queue.Succeeded
		return out, "2xx"
	case st == http.StatusTooManyRequests || (st == http.StatusServiceUnavailable && hasWait):
		br.report(now, probe, healthy) // it answers: it is up, and asks us to wait
		class := "5xx"
		if st == http.StatusTooManyRequests {
			class = "429"
		}
		if !hasWait {
			wait = d.backoff(job.Attempts)
		}
		return d.pushback(job, r, out, now.Add(wait), statusError(st, body), accountOut), class
	case st >= 500 || st == http.StatusRequestTimeout:
		class := "5xx"
		if st < 500 {
			class = "4xx"
		}
		return d.failure(job, r, br, probe, out, now, statusError(st, body)), class
	case st >= 300 && st < 400:
		br.report(now, probe, healthy)
		out.Result = queue.Failed
		out.Error = statusError(st, body) + " (redirects are not followed: point the downstream url at the final address)"
		return out, "3xx"
	default:
		br.report(now, probe, healthy)
		out.Result = queue.Failed
		out.Error = statusError(st, body)
		return out, "4xx"
	}
}

// pushback pauses the job's tenant until until (and the downstream, when it
// has a ceiling: its account-wide limit is what was hit): sends waiting at
// the gate give up and go back in line; the job keeps its place, first when
// the pause ends, and its attempts are not used up.
func (d *Dispatcher) pushback(job queue.Job, r Route, out queue.Outcome, until time.Time, msg string, downstreamToo bool) queue.Outcome {
	// At least one interval: "Retry-After: 0" must not mean "again at once,
	// and again".
	until = clock.Later(until, d.clock.Now().Add(r.Policy.Interval))
	d.hold(job, r, until)
	if downstreamToo {
		d.holdDownstream(r, until)
	}
	out.Result, out.Error, out.NotBefore, out.PauseUntil = queue.Retry, msg, until, until
	out.PauseDownstream = r.Ceiling != nil
	return out
}

// hold stops the sends of job's tenant (and of its downstream, when it
// has a ceiling: its account-wide limit is what ran out) until until, as
// a pushback does: those waiting at the gate give up and go back in line,
// their tenant paused until then (unsentOutcome), and after it one goes
// at once and the rest one interval apart.
func (d *Dispatcher) hold(job queue.Job, r Route, until time.Time) {
	d.holdTenant(job, r, until)
	if r.Ceiling != nil {
		d.holdDownstream(r, until)
	}
}

// holdTenant stops the sends of job's tenant until until; after it one
// goes at once and the rest one interval apart.
func (d *Dispatcher) holdTenant(job queue.Job, r Route, until time.Time) {
	d.gate.Hold(tenantKey(job.Tenant), until)
	d.gate.Space(tenantKey(job.Tenant), until.Add(r.Policy.Tolerance()))
}

// holdDownstream stops the sends of every tenant of r's downstream until
// until (those waiting give up and go back in line, each tenant paused).
func (d *Dispatcher) holdDownstream(r Route, until time.Time) {
	d.gate.Hold(downstreamKey(r.Downstream), until)
	if r.Ceiling != nil {
		d.gate.Space(downstreamKey(r.Downstream), until.Add(r.Ceiling.Tolerance()))
	}
}

// announcedWait is the hold an answer's rate limit fields ask for (false:
// they leave room, or are not read), at most the route's bound (capped:
// the reset was further away) and at least one interval of the tenant's
// rate (a reset now must not mean "again at once, and again").
func announcedWait(r Route, a *answer) (wait time.Duration, capped, ok bool) {
	if !a.exhausted {
		return 0, false, false
	}
	wait = a.wait
	if r.MaxHold > 0 && wait > r.MaxHold {
		wait, capped = r.MaxHold, true
	}
	return max(wait, r.Policy.Interval), capped, true
}

// tellAnnounced tells OnAnnounced of a hold an answer's fields asked for.
func (d *Dispatcher) tellAnnounced(job queue.Job, wait time.Duration, capped bool) {
	if d.announced != nil {
		d.announced(job, wait, capped)
	}
}

// failure handles a 5xx, timeout or connection error: it feeds the
// circuit breaker, and retries the job with backoff or fails it once its
// attempts are used up. A failed probe only waits for the next one.
func (d *Dispatcher) failure(job queue.Job, r Route, br *breaker, probe bool, out queue.Outcome, now time.Time, msg string) queue.Outcome {
	opened, probeAt := br.report(now, probe, failing)
	if opened {
		// Sends of other jobs waiting for their slot give up now.
		d.gate.Hold(downstreamKey(r.Downstream), probeAt)
	}
	if probe {
		out.Result, out.NotBefore, out.PauseUntil = queue.Retry, probeAt, probeAt
		out.Error = fmt.Sprintf("%s (circuit breaker open: next probe at %s)", msg, probeAt.UTC().Format(time.RFC3339))
		return out
	}
	out.Error = msg
	if job.Failures+1 >= r.MaxAttempts {
		out.Result = queue.Failed
		out.Error = fmt.Sprintf("gave up after %d failed attempts: %s", job.Failures+1, msg)
		return out
	}
	out.Result = queue.Retry
	out.NotBefore = now.Add(d.backoff(job.Attempts))
	return out
}

// backoff is backoff(attempt) on the dispatcher's random source.
func (d *Dispatcher) backoff(attempt int) time.Duration {
	d.randMu.Lock()
	defer d.randMu.Unlock()
	return backoff(attempt, d.rand)
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Backoff bounds for 5xx, timeouts and connection errors.
const (
	BackoffBase = time.Second
	BackoffCap  = 5 * time.Minute
)

// backoff is capped exponential backoff with full jitter: uniform in
// [0, min(cap, base * 2^(attempt-1))]. attempt counts from 1.
func backoff(attempt int, r *rand.Rand) time.Duration {
	ceiling := BackoffCap
	if attempt <= 20 {
		ceiling = min(BackoffCap, BackoffBase<<(attempt-1))
	}
	return time.Duration(r.Int64N(int64(ceiling) + 1))
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(h, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if at, err := http.ParseTime(h); err == nil {
		return max(0, at.Sub(now)), true
	}
	return 0, false
}

// excerpt is the start of a response body, fit for last_error.
func excerpt(body []byte) string {
	const limit = 512
	s := string(body)
	if len(s) > limit {
		s = s[:limit]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return strings.TrimSpace(s)
}

func statusError(status int, body []byte) string {
	msg := fmt.Sprintf("%d %s", status, http.StatusText(status))
	if e := excerpt(body); e != "" {
		msg += ": " + e
	}
	return msg
}
