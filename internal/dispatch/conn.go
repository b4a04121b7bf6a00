package dispatch

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// timedConn tells the dispatcher when a request's first bytes were really
// written. Between the gate letting a request go and the write there is a
// goroutine hand-off inside net/http that a busy machine can stretch by
// milliseconds; a request written late must hold back the next one by as
// much, or the two reach the downstream too close together.
type timedConn struct {
	net.Conn

	mu      sync.Mutex
	onWrite func(time.Time)
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	f := c.onWrite
	c.onWrite = nil
	c.mu.Unlock()
	if f != nil {
		f(time.Now())
	}
	return c.Conn.Write(p)
}

// notifyWrite arranges for f to be called at the next write on conn, if
// conn is one of ours (possibly under TLS).
func notifyWrite(conn net.Conn, f func(time.Time)) {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if c, ok := conn.(*timedConn); ok {
		c.mu.Lock()
		c.onWrite = f
		c.mu.Unlock()
	}
}

func timedDialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &timedConn{Conn: c}, nil
	}
}
