package dispatch

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// pacedConn passes the tenant's gate in the goroutine that writes, right
// before a request's first bytes, and reports when they were written.
// Pacing anywhere earlier (when the connection is handed out, say) leaves a
// goroutine hand-off inside net/http between the gate and the write that a
// busy machine can stretch by milliseconds: a request written late then
// reaches the downstream too close to the next one, or holds it back.
type pacedConn struct {
	net.Conn

	mu      sync.Mutex
	pending *pacedWrite
}

// pacedWrite is what the next write on a connection must do first: pass
// the gate (or give up, writing nothing), and tell when it wrote.
type pacedWrite struct {
	pass  func() (*Ticket, error) // waits at the gate; an error: write nothing
	wrote func(time.Time)         // told when the first bytes were written
	clock clock.Clock
	// done is closed once the write was made (and wrote told) or refused.
	// An answer can be read before the writing goroutine gets to tell
	// wrote; whoever reads the answer waits for this first.
	done chan struct{}
}

func (c *pacedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	pw := c.pending
	c.pending = nil
	c.mu.Unlock()
	if pw == nil {
		return c.Conn.Write(p)
	}
	defer close(pw.done)
	ticket, err := pw.pass()
	if err != nil {
		return 0, err // nothing written
	}
	n, err := c.Conn.Write(p)
	// Stamped after the write returns: the bytes left no later than this,
	// even if the thread was descheduled inside the call. Counted as sent
	// even on error: some bytes may have left.
	at := pw.clock.Now()
	ticket.Wrote(at)
	pw.wrote(at)
	return n, err
}

// pace arranges for the next write on conn to pass the gate first. It
// reports false if conn is not one of ours (a client not from NewClient).
func pace(conn net.Conn, pw *pacedWrite) bool {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	c, ok := conn.(*pacedConn)
	if !ok {
		return false
	}
	c.mu.Lock()
	c.pending = pw
	c.mu.Unlock()
	return true
}

func pacedDialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &pacedConn{Conn: c}, nil
	}
}

// RemoteGate asks the gate every process of a shared store passes (see
// queue.RedisStore.PassGate) whether one send may go now.
type RemoteGate func(ctx context.Context) (queue.GateAnswer, error)

// remoteBudget is how soon after asking a grant of the shared gate must be
// used: the gate's clock read happens after the question leaves, so a
// write within the budget is never more than that after the time the gate
// recorded, and the grant's Confirm moves the lanes on from the real write
// before the next grant (its time plus how long after asking the write
// came). A later write asks again.
const remoteBudget = time.Millisecond

// passRemote waits until the shared gate lets a send go, ready to write at
// once. A held lane, or a gate that cannot be asked, is a *HeldError: the
// job goes back to waiting, nothing is sent. So is a lane busy for longer
// than maxRemoteWait (a downstream's ceiling with a backlog), or a gate
// whose answers keep coming back too late to be used. A grant that comes
// after deadline (zero: none) is errExpired. When ctx is done first, it
// returns ctx's error.
//
// A grant is used only if it came within remoteBudget of asking, on the
// clock read last before the write: after that check only the attempt's
// timeout is started again (no I/O) before the bytes go.
func passRemote(ctx context.Context, clk clock.Clock, remote RemoteGate, deadline time.Time) (*remoteGrant, error) {
	asked := clk.Now()
	ans, err := remote(ctx)
	for late := 0; ; {
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, &HeldError{Key: "the shared gate (" + err.Error() + ")", Until: clk.Now().Add(time.Second), Busy: true}
		case !ans.HeldUntil.IsZero():
			return nil, &HeldError{Key: "the shared gate", Until: ans.HeldUntil}
		case ans.Wait > maxRemoteWait:
			return nil, &HeldError{Key: "the shared gate", Until: clk.Now().Add(ans.Wait), Busy: true}
		case ans.Wait > 0:
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-clk.After(ans.Wait):
			}
			asked = clk.Now()
			ans, err = remote(ctx)
		case !deadline.IsZero() && clk.Now().After(deadline):
			if ans.Confirm != nil {
				go confirm(context.WithoutCancel(ctx), ans.Confirm, 0, false)
			}
			return nil, errExpired
		case clk.Now().Sub(asked) <= remoteBudget:
			return &remoteGrant{asked: asked, confirm: ans.Confirm}, nil
		case late >= maxLateGrants:
			return nil, &HeldError{Key: fmt.Sprintf("the shared gate (its answers took over %v %d times in a row: is Redis far, or fsyncing every write?)", remoteBudget, late), Until: clk.Now().Add(time.Second), Busy: true}
		default:
			// Granted too long ago: a write now could reach the downstream
			// too close to another process's next send. Give the grant
			// back (unless another came after it) and ask again, in one
			// round trip.
			late++
			asked = clk.Now()
			ans, err = ans.Again(ctx)
		}
	}
}

// remoteGrant is a grant of the shared gate being used: when it was asked
// for, and how to tell the gate when its request was written (nil: no
// need).
type remoteGrant struct {
	asked   time.Time
	confirm func(ctx context.Context, wroteAfter time.Duration, written bool) error
	once    sync.Once
}

// resolve confirms the grant once: written at (zero: not written).
func (g *remoteGrant) resolve(ctx context.Context, at time.Time) {
	if g == nil || g.confirm == nil {
		return
	}
	g.once.Do(func() { go confirm(context.WithoutCancel(ctx), g.confirm, at.Sub(g.asked), !at.IsZero()) })
}

// confirm tells the gate, within a second: past that the gate stops
// waiting for it anyway.
func confirm(ctx context.Context, c func(context.Context, time.Duration, bool) error, wroteAfter time.Duration, written bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = c(ctx, max(wroteAfter, 0), written) // lost: the gate's hold lapses by itself
}

// maxRemoteWait is the longest a send waits at the shared gate before it
// goes back to waiting in the store (no attempt used); maxLateGrants, how
// many grants in a row may come back too late before it does.
const (
	maxRemoteWait = time.Second
	maxLateGrants = 20
)
