// Package fakegateway is a stand-in for a rate-limited vendor API (an SMS
// gateway): it enforces its own limit, answering 429 with Retry-After past
// it, and prints each request it takes. cmd/fakegateway runs it; tests use
// it to show that throttler never makes a vendor say no.
package fakegateway

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
)

// Gateway is an http.Handler.
type Gateway struct {
	policy    *leaky.Policy // nil: no limit
	tolerance time.Duration
	status    int
	out       io.Writer

	mu    sync.Mutex
	state leaky.State
	last  time.Time

	Accepted, Refused atomic.Int64

	// ArrivedAt, if set, says when a request arrived (default: now). Tests
	// set it to the kernel's receive time, so that the test process's own
	// scheduling does not count as the sender's.
	ArrivedAt func(r *http.Request) time.Time
}

// Tolerance is how early a request may come and still be taken: like a
// real vendor's limiter, this one allows for network jitter (DESIGN.md's
// 2 ms).
const Tolerance = 2 * time.Millisecond

// New returns a gateway that allows rate (nil: unlimited) with a burst,
// answers status to what it takes, and prints requests to out (nil: quiet).
func New(rate *leaky.Rate, burst, status int, out io.Writer) *Gateway {
	g := &Gateway{status: status, out: out, tolerance: Tolerance}
	if rate != nil {
		g.policy = &leaky.Policy{Interval: rate.Interval(), Burst: max(1, burst)}
	}
	return g
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	if g.ArrivedAt != nil {
		if at := g.ArrivedAt(r); !at.IsZero() {
			now = at
		}
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
	g.mu.Lock()
	if g.policy != nil {
		// Judged as if it came a little later: GCRA with the tolerance.
		d, st := leaky.Admit(g.state, now.Add(g.tolerance), *g.policy)
		if !d.Admitted {
			g.mu.Unlock()
			g.Refused.Add(1)
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.RetryAfter.Seconds())), 10))
			http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
			if g.out != nil {
				fmt.Fprintf(g.out, "%s  429 tenant=%s key=%s (over the gateway's limit)\n", now.Format("15:04:05.000"), r.Header.Get("X-Throttler-Tenant"), r.Header.Get("Idempotency-Key"))
			}
			return
		}
		g.state = st
	}
	gap := "-"
	if !g.last.IsZero() {
		gap = now.Sub(g.last).Round(time.Millisecond).String()
	}
	g.last = now
	g.mu.Unlock()
	g.Accepted.Add(1)
	if g.out != nil {
		fmt.Fprintf(g.out, "%s  +%-8s tenant=%s attempt=%s key=%s  %s\n", now.Format("15:04:05.000"), gap,
			r.Header.Get("X-Throttler-Tenant"), r.Header.Get("X-Throttler-Attempt"), r.Header.Get("Idempotency-Key"), body)
	}
	w.WriteHeader(g.status)
}
