// Package downstreamtest is a downstream for tests: a real HTTP server on a
// loopback port that records when each request reached it, and the checks
// of DESIGN.md invariant 1 on those times.
//
// Arrival times are the kernel's receive timestamps (SO_TIMESTAMPNS) of the
// segment that brought the request, not the moment a handler ran: a test
// process's own scheduling hiccups (measured here at up to ~3.6 ms between
// the wire and the handler) are not the throttler's, and would otherwise
// show up as spacing errors it did not make.
package downstreamtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// Arrival is one request as the downstream received it.
type Arrival struct {
	At      time.Time // kernel receive time of the request's first bytes
	Handled time.Time // when the handler ran
	Key     string    // Idempotency-Key
	Tenant  string    // X-Throttler-Tenant
	Attempt string    // X-Throttler-Attempt
	Body    string
}

// Server is a recording downstream.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	arrivals []Arrival
	answer   http.HandlerFunc
	// slowHandshakes: the next this many TLS handshakes start
	// handshakeDelay after their connection is accepted.
	slowHandshakes int
	handshakeDelay time.Duration
}

// SlowHandshakes makes the next n TLS handshakes start d late (an HTTPS
// downstream only): the client's connection is ready, and its request
// written, that much later, as with a vendor slow to accept. (A plain
// connection cannot be made slow this way: the kernel completes it.)
func (s *Server) SlowHandshakes(n int, d time.Duration) {
	s.mu.Lock()
	s.slowHandshakes, s.handshakeDelay = n, d
	s.mu.Unlock()
}

// handshakeWait is how long the next TLS handshake waits before it starts.
func (s *Server) handshakeWait() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slowHandshakes <= 0 {
		return 0
	}
	s.slowHandshakes--
	return s.handshakeDelay
}

// New starts a recording downstream that answers 200 on a free loopback
// port; it stops when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// NewTLS is New over HTTPS, with cfg the server's TLS config (its
// certificate, and a client certificate it requires, if any).
func NewTLS(t testing.TB, cfg *tls.Config) *Server {
	t.Helper()
	s, err := StartTLS("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start starts a recording downstream on addr (a loopback address); Close
// stops it.
func Start(addr string) (*Server, error) { return start(addr, nil) }

// StartTLS is Start over HTTPS (see NewTLS). An arrival's time is still
// that of the request's first bytes: those of the TLS handshake before
// them are not counted. (Handlers see no r.TLS: the connection is wrapped.)
func StartTLS(addr string, cfg *tls.Config) (*Server, error) { return start(addr, cfg) }

func start(addr string, cfg *tls.Config) (*Server, error) {
	s := &Server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// On the listener too: a request can arrive before its connection is
	// accepted, and only a socket that already asks for timestamps (the
	// listener's, inherited by the connection) gets one for it.
	if raw, err := l.(*net.TCPListener).SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
		})
	}
	s.Server.Listener.Close()
	s.Server.Listener = stampListener{l}
	if cfg != nil {
		s.Server.Listener = tlsListener{stampListener{l}, cfg, s}
	}
	s.Server.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	s.Start()
	if cfg != nil {
		s.URL = "https://" + l.Addr().String()
	}
	return s, nil
}

// stamper is a connection that knows when a request's first bytes came.
type stamper interface {
	takeStamp() (time.Time, bool)
}

// tlsListener serves TLS on stamped connections.
type tlsListener struct {
	stampListener
	cfg *tls.Config
	s   *Server
}

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.stampListener.Accept()
	if err != nil {
		return nil, err
	}
	sc, _ := c.(*stampConn)
	return &tlsStampConn{Conn: tls.Server(c, l.cfg), raw: sc, wait: l.s.handshakeWait()}, nil
}

// tlsStampConn is a TLS connection whose stamps start after the handshake.
type tlsStampConn struct {
	*tls.Conn
	raw  *stampConn    // nil: no stamps (handler time is used)
	wait time.Duration // before the handshake (SlowHandshakes)
	once sync.Once
	// lastHandshakeRead is the receive time of the handshake's last read.
	// The client writes its first request right after its Finished; when
	// the server is slow to read (a busy machine), both come in that one
	// read, and no read after the handshake stamps the request. The
	// kernel's stamp of a TCP read is that of the last segment it took:
	// then the request's.
	lastHandshakeRead time.Time
}

func (c *tlsStampConn) Read(p []byte) (int, error) {
	c.once.Do(func() {
		time.Sleep(c.wait)
		if c.Conn.Handshake() == nil && c.raw != nil {
			// The handshake's bytes are not a request's. Its last read's
			// stamp, not its first's (the ClientHello, before the slot:
			// a busy CI run of TestHTTPSPacingSeenAtTheDownstream saw
			// "arrival 0 before its slot").
			c.lastHandshakeRead = c.raw.lastStamp()
		}
	})
	return c.Conn.Read(p)
}

func (c *tlsStampConn) takeStamp() (time.Time, bool) {
	if c.raw == nil {
		return time.Time{}, false
	}
	ts, ok := c.raw.takeStamp()
	if !ok && !c.lastHandshakeRead.IsZero() {
		// The first request came in the handshake's last read.
		ts, ok = c.lastHandshakeRead, true
	}
	c.lastHandshakeRead = time.Time{}
	return ts, ok
}

// Answer sets how the downstream answers from now on (nil: 200).
func (s *Server) Answer(h http.HandlerFunc) {
	s.mu.Lock()
	s.answer = h
	s.mu.Unlock()
}

type connKey struct{}

type arrivalKey struct{}

// ArrivalTime is when the request an Answer handler is given reached the
// server (its kernel receive time); the zero time outside an Answer.
func ArrivalTime(r *http.Request) time.Time {
	at, _ := r.Context().Value(arrivalKey{}).(time.Time)
	return at
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	handled := time.Now()
	at := handled
	if c, ok := r.Context().Value(connKey{}).(stamper); ok {
		if stamp, ok := c.takeStamp(); ok {
			at = stamp
		}
	}
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.arrivals = append(s.arrivals, Arrival{At: at, Handled: handled, Key: r.Header.Get("Idempotency-Key"),
		Tenant: r.Header.Get("X-Throttler-Tenant"), Attempt: r.Header.Get("X-Throttler-Attempt"), Body: string(body)})
	answer := s.answer
	s.mu.Unlock()
	if answer != nil {
		r.Body = io.NopCloser(bytes.NewReader(body)) // the answer may read it too
		answer(w, r.WithContext(context.WithValue(r.Context(), arrivalKey{}, at)))
		return
	}
	w.WriteHeader(http.StatusOK)
}

// All returns every arrival so far, in arrival order.
func (s *Server) All() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]Arrival(nil), s.arrivals...)
	sortByTime(out)
	return out
}

// Of returns the arrivals of one tenant.
func (s *Server) Of(tenant string) []Arrival {
	var out []Arrival
	for _, a := range s.All() {
		if a.Tenant == tenant {
			out = append(out, a)
		}
	}
	return out
}

// Keys counts arrivals per Idempotency-Key.
func (s *Server) Keys() map[string]int {
	m := map[string]int{}
	for _, a := range s.All() {
		m[a.Key]++
	}
	return m
}

func sortByTime(a []Arrival) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j].At.Before(a[j-1].At); j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// Jitter is the stretch DESIGN.md invariant 1 allows windows for clock and
// scheduling jitter.
const Jitter = 2 * time.Millisecond

// WindowViolation checks DESIGN.md invariant 1 on arrivals (sorted): in any
// window of length W at most (W + Jitter)/T + burst. It returns "" or a
// description of the first violation with every arrival listed.
func WindowViolation(arrivals []Arrival, T time.Duration, burst int) string {
	for i := range arrivals {
		for j := i + 1; j < len(arrivals); j++ {
			w := arrivals[j].At.Sub(arrivals[i].At)
			if n := j - i + 1; float64(n) > float64(w+Jitter)/float64(T)+float64(burst) {
				var b strings.Builder
				fmt.Fprintf(&b, "%d attempts within %v (T = %v, burst %d): arrivals %d..%d; all:", n, w, T, burst, i, j)
				for k, a := range arrivals {
					fmt.Fprintf(&b, "\n  %3d +%-12v %s attempt %s", k, a.At.Sub(arrivals[0].At).Round(10*time.Microsecond), a.Key, a.Attempt)
				}
				return b.String()
			}
		}
	}
	return ""
}

// CheckWindows fails t if arrivals break the window rule.
func CheckWindows(t testing.TB, arrivals []Arrival, T time.Duration, burst int) {
	t.Helper()
	if v := WindowViolation(arrivals, T, burst); v != "" {
		t.Fatal(v)
	}
}

// stampListener turns on kernel receive timestamps for every connection.
type stampListener struct{ net.Listener }

func (l stampListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	raw, err := tc.SyscallConn()
	if err != nil {
		return c, nil
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return c, nil // no stamps: handler time is used
	}
	return &stampConn{TCPConn: tc, raw: raw}, nil
}

// stampConn reads with recvmsg to get each segment's receive timestamp.
type stampConn struct {
	*net.TCPConn
	raw syscall.RawConn

	mu    sync.Mutex
	stamp time.Time // receive time of the first bytes not yet claimed by a request
	last  time.Time // receive time of the last read
}

func (c *stampConn) Read(p []byte) (int, error) {
	var n int
	var oob [256]byte
	var oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), p, oob[:], 0)
		return rerr != syscall.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	if ts, ok := parseStamp(oob[:oobn]); ok {
		c.mu.Lock()
		if c.stamp.IsZero() {
			c.stamp = ts
		}
		c.last = ts
		c.mu.Unlock()
	}
	return n, nil
}

// lastStamp is the receive time of the last read, and clears the stamp of
// the first bytes not yet claimed (the handshake's: see tlsStampConn).
func (c *stampConn) lastStamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stamp = time.Time{}
	return c.last
}

// takeStamp returns the receive time of the bytes the current request came
// in, and clears it for the next request on the connection.
func (c *stampConn) takeStamp() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.stamp
	c.stamp = time.Time{}
	return ts, !ts.IsZero()
}

func parseStamp(oob []byte) (time.Time, bool) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := *(*syscall.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Sec, ts.Nsec), true
		}
	}
	return time.Time{}, false
}
