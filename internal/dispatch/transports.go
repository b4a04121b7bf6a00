package dispatch

import (
	"net/http"
	"sync"

	"github.com/throttler-dev/throttler/internal/outbound"
)

// clients are the HTTP clients of the downstreams: one per distinct TLS
// config (outbound.Downstream.TLSKey), so that downstreams that trust the
// same CAs with the same client certificate share connections, and a
// downstream's certificate never goes to another's host. Each is a copy of
// the base client's *http.Transport with only TLSClientConfig changed: the
// same paced dialer, HTTP/1.1 only. TLS is set up by net/http on the
// paced connection, never by a dialer of ours, so pace() finds the
// pacedConn under the *tls.Conn and every HTTPS write still passes the
// gate; the handshake is part of the connection setup that happens before
// GotConn, so before the slot.
type clients struct {
	base *http.Client // the system's TLS defaults (TLSKey "")

	mu    sync.Mutex
	byKey map[string]*http.Client
}

func newClients(base *http.Client) *clients {
	return &clients{base: base, byKey: map[string]*http.Client{}}
}

// forTLS is the client for o's TLS config. A base client whose transport
// is not an *http.Transport (a test's) is used as it is.
func (c *clients) forTLS(o *outbound.Downstream) *http.Client {
	key := o.TLSKey()
	if key == "" {
		return c.base
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.byKey[key]; cl != nil {
		return cl
	}
	tr, ok := c.base.Transport.(*http.Transport)
	if !ok {
		return c.base
	}
	tr = tr.Clone()
	tr.TLSClientConfig = o.TLSConfig()
	cl := &http.Client{Transport: tr, CheckRedirect: c.base.CheckRedirect, Jar: c.base.Jar, Timeout: c.base.Timeout}
	c.byKey[key] = cl
	return cl
}

// keep drops the clients of TLS configs not in keys (a reload changed or
// removed them) and closes their idle connections. Requests in flight on
// them finish; their connections close once idle.
func (c *clients) keep(keys map[string]bool) {
	c.mu.Lock()
	var gone []*http.Client
	for key, cl := range c.byKey {
		if !keys[key] {
			gone = append(gone, cl)
			delete(c.byKey, key)
		}
	}
	c.mu.Unlock()
	for _, cl := range gone {
		cl.CloseIdleConnections()
	}
}

// closeIdle closes every client's idle connections.
func (c *clients) closeIdle() {
	c.mu.Lock()
	all := []*http.Client{c.base}
	for _, cl := range c.byKey {
		all = append(all, cl)
	}
	c.mu.Unlock()
	for _, cl := range all {
		cl.CloseIdleConnections()
	}
}

// UseTLS tells the dispatcher which downstreams' configs are current
// (after a reload): the transports of TLS configs none of them has any
// more are dropped and their idle connections closed, so a changed CA or
// client certificate is used from the next connection on.
func (d *Dispatcher) UseTLS(current []*outbound.Downstream) {
	keys := map[string]bool{}
	for _, o := range current {
		keys[o.TLSKey()] = true
	}
	d.clients.keep(keys)
}

// CloseIdleConnections closes the idle connections of every transport.
func (d *Dispatcher) CloseIdleConnections() { d.clients.closeIdle() }
