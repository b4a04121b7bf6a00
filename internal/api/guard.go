package api

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// The rate a request body must keep up: all of it within bodyGrace plus
// one second per bodyMinRate bytes, and never past bodyMaxTime. A body
// that trickles in holds a request slot while it does; this bounds how
// long a client that sends nothing useful can hold one.
const (
	bodyGrace   = 5 * time.Second
	bodyMinRate = 64 << 10 // bytes a second
	bodyMaxTime = 45 * time.Second
)

// limit caps requests handled at once: past the cap, 503 at once (shed load
// instead of queueing until memory runs out). Each client (a token, or an
// address where a request has none) holds at most its share of the slots,
// so that one client, a scoped token's holder trickling bodies say, cannot
// take the service from the others; bodies must keep up bodyMinRate. The
// health endpoints are outside the caps: an orchestrator must not restart a
// healthy process because a client is hostile. It also bounds every
// request body; the job routes bound theirs more tightly.
//
// A request that waits for a job to finish (?wait) is counted apart, under
// a larger cap: it holds a goroutine and a watcher for up to a minute, and
// must not keep the others out meanwhile.
func (s *server) limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		cfg := s.config().Server
		who := clientOf(r)
		share := cfg.RequestsPerClient()
		if !s.clients.take(who, share) {
			shed(w, r)
			writeError(w, http.StatusServiceUnavailable, "overloaded", fmt.Sprintf("%s has %d requests open at once, its most (server.max_requests_per_client); wait for one to end", who, share), nil)
			return
		}
		defer s.clients.give(who)
		slots, what := s.slots, "requests"
		if isJobWait(r) {
			slots, what = s.waiters, "requests waiting for jobs (?wait)"
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			shed(w, r)
			writeError(w, http.StatusServiceUnavailable, "overloaded", fmt.Sprintf("more than %d %s at once; try again", cap(slots), what), nil)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, cfg.MaxBatchBytes)
		if r.ContentLength != 0 {
			r.Body = newPacedBody(w, r.Body, s.clock.Now())
		}
		next.ServeHTTP(w, r)
	})
}

// shed readies a 503 for a request refused for load: Retry-After, and the
// connection closed after it if a body was coming. net/http would otherwise
// read up to 256 KiB of the body before answering, which a body that
// trickles in stretches to the read timeout.
func shed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// clientOf names who holds a request's share of the slots: its token, or
// its address if it has none (no tokens configured, or a public path).
func clientOf(r *http.Request) string {
	if t := principal(r); t != nil {
		return fmt.Sprintf("token %q", t.Name)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "client " + host
}

// clientSlots counts each client's requests open.
type clientSlots struct {
	mu   sync.Mutex
	open map[string]int
}

func (c *clientSlots) take(who string, most int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[who] >= most {
		return false
	}
	if c.open == nil {
		c.open = map[string]int{}
	}
	c.open[who]++
	return true
}

func (c *clientSlots) give(who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[who]--; c.open[who] <= 0 {
		delete(c.open, who) // memory in proportion to clients with requests open
	}
}

// pacedBody is a request body read under a deadline that moves on only as
// its bytes arrive (see bodyMinRate). Once it is read to its end the
// deadline is lifted: net/http reads the connection in the background
// while the handler runs, and a read that times out there cancels the
// request's context (a long poll, a slow store).
type pacedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	read  int64
}

func newPacedBody(w http.ResponseWriter, body io.ReadCloser, start time.Time) io.ReadCloser {
	b := &pacedBody{ReadCloser: body, rc: http.NewResponseController(w), start: start}
	b.setDeadline()
	return b
}

// setDeadline gives the body until bodyGrace plus the time its bytes so
// far were due. A writer without deadlines (a test's recorder) has none.
func (b *pacedBody) setDeadline() {
	due := bodyGrace + time.Duration(b.read)*time.Second/bodyMinRate
	_ = b.rc.SetReadDeadline(b.start.Add(min(due, bodyMaxTime)))
}

func (b *pacedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if n > 0 && err == nil { // at the end, the deadline is lifted below instead
		b.setDeadline()
	}
	switch {
	case err == io.EOF:
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = errSlowBody
	}
	return n, err
}

// errSlowBody is a body that did not keep up bodyMinRate.
var errSlowBody = fmt.Errorf("the request body came slower than %d KiB/s after its first %v (or took over %v): send it at once", bodyMinRate>>10, bodyGrace, bodyMaxTime)
