package bolt

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Caps on attempts in flight (DESIGN.md 6e). An attempt is in flight from
// its hand-over to the dispatcher until its outcome is durable (unclaim):
// the store hands a tenant over no more jobs than its caps leave room for,
// so the dispatcher never holds a job it may not start, and a capped
// tenant's backlog waits here, in order, not at the gate. Capped tenants'
// due jobs go through their downstream's fair queue, where a tenant at its
// cap passes its turn and a downstream at its cap hands nothing over.

// capKeys are the counts a claim of tenant holds.
type capKeys struct{ name, tenant, shared string }

func capKeysOf(c queue.Caps, tenant string) capKeys {
	return capKeys{name: tenant, tenant: "tenant:" + tenant, shared: "downstream:" + c.Downstream}
}

// openAtCrash is what a scope had possibly open at the vendor when the
// process died: the store writes no claim, so after a crash it counts as
// many places as there were jobs whose time had come (its cap at most) as
// in flight until the last of them could have timed out.
type openAtCrash struct {
	n     int
	until time.Time
}

func noCaps(string) queue.Caps { return queue.Caps{} }

// capHold counts claim id of tenant, under caps c, in flight (s.mu held).
func (s *Store) capHold(id, tenant string, c queue.Caps) {
	k := capKeysOf(c, tenant)
	s.capHeld[id] = k
	s.open[k.tenant]++
	s.open[k.shared]++
}

// capRelease ends claim id's count (s.mu held), and wakes the dispatcher
// if its scope is capped: a job waiting for that place may go.
func (s *Store) capRelease(id string) {
	k, ok := s.capHeld[id]
	if !ok {
		return
	}
	delete(s.capHeld, id)
	for _, key := range []string{k.tenant, k.shared} {
		if s.open[key]--; s.open[key] <= 0 {
			delete(s.open, key)
		}
	}
	if s.caps(k.name).Capped() {
		s.poke()
	}
}

// capRoom reports whether tenant may be handed a job now under caps c, and
// if not, whether it is its downstream's cap that is reached (no tenant of
// it may go) and when a crash's count ends (zero: it waits for an outcome).
// s.mu held.
func (s *Store) capRoom(c queue.Caps, tenant string, now time.Time) (ok, shared bool, wake time.Time) {
	k := capKeysOf(c, tenant)
	if c.Shared > 0 {
		if n, until := s.openIn(k.shared, now); n >= c.Shared {
			return false, true, until
		}
	}
	if c.Tenant > 0 {
		if n, until := s.openIn(k.tenant, now); n >= c.Tenant {
			return false, false, until
		}
	}
	return true, false, time.Time{}
}

// openIn is how many attempts of key are in flight, those a crash may
// have left open counted until they end (returned, zero if none).
func (s *Store) openIn(key string, now time.Time) (int, time.Time) {
	n := s.open[key]
	if c, ok := s.crashOpen[key]; ok {
		if now.Before(c.until) {
			return n + c.n, c.until
		}
		delete(s.crashOpen, key)
	}
	return n, time.Time{}
}

// countOpenAtCrash notes, after an unclean stop, the places of each
// capped scope that a send written before the crash may still hold: one
// per job of it whose time had come by sentBy (its cap at most), until
// sentBy plus the downstream's timeout. Run by recover, before the store
// is shared.
func (s *Store) countOpenAtCrash(byTenant map[string][]waitingJob, sentBy time.Time) {
	due := map[string]int{}
	caps := map[string]int{}
	until := map[string]time.Time{}
	for name, jobs := range byTenant {
		c := s.caps(name)
		if !c.Capped() {
			continue
		}
		n := 0
		for _, w := range jobs {
			if w.dispatchAt < nanos(sentBy) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		k := capKeysOf(c, name)
		end := sentBy.Add(c.Timeout)
		if c.Tenant > 0 {
			due[k.tenant], caps[k.tenant], until[k.tenant] = n, c.Tenant, end
		}
		if c.Shared > 0 {
			due[k.shared] += n
			caps[k.shared] = c.Shared
			until[k.shared] = clock.Later(until[k.shared], end)
		}
	}
	for key, n := range due {
		s.crashOpen[key] = openAtCrash{n: min(n, caps[key]), until: until[key]}
	}
}
