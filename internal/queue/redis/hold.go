package redis

import (
	"context"
	_ "embed"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

var (
	//go:embed pause.lua
	pauseLua string
	//go:embed settle.lua
	settleLua string

	pauseScript  = newScript("pause.lua", pauseLua, false)
	settleScript = newScript("settle.lua", settleLua, true)
)

// Pause implements queue.Store: an operator's hold, in the tenant's state
// and at the shared gate, which every process sees.
func (s *Store) Pause(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.setHold(ctx, tenant, true)
}

// Resume implements queue.Store.
func (s *Store) Resume(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.setHold(ctx, tenant, false)
}

// setHold holds tenant (held) or ends its hold, in its state (pause.lua)
// and in its gate lane (gatehold.lua), and reports the tenant.
func (s *Store) setHold(ctx context.Context, tenant string, held bool) (queue.TenantStatus, error) {
	k := keysOf(s.partOf(tenant))
	p := s.policy(tenant)
	op, gateOp := "hold", "hold"
	if !held {
		op, gateOp = "resume", "free"
	}
	if err := pauseScript.Run(ctx, s.rdb, []string{k.tenant(tenant)}, []any{op, s.now(), usCeil(p.Tolerance())}, nil); err != nil {
		return queue.TenantStatus{}, err
	}
	if err := settleScript.Run(ctx, s.rdb, []string{k.tenant(tenant)}, []any{s.now(), s.idle.Milliseconds()}, nil); err != nil {
		return queue.TenantStatus{}, err
	}
	ds, _ := s.ceiling(tenant)
	lane, _ := gateKeys(ds, tenant)
	if err := gateHoldScript.Run(ctx, s.rdb, []string{lane}, []any{gateOp, 0, 0, time.Hour.Milliseconds()}, nil); err != nil {
		return queue.TenantStatus{}, err
	}
	if !held {
		s.wakeResumed(tenant)
	}
	return s.Tenant(ctx, tenant)
}

// addConsumer and removeConsumer keep the Consume calls of this process,
// which a resume here wakes at once (resumes elsewhere are seen at the
// held jobs' next claim, within heldRecheck).
func (s *Store) addConsumer(c *consumer) {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	s.consumers[c] = struct{}{}
}

func (s *Store) removeConsumer(c *consumer) {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	delete(s.consumers, c)
}

// wakeResumed wakes this process's held jobs of tenant.
func (s *Store) wakeResumed(tenant string) {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	for c := range s.consumers {
		c.resumed(tenant)
	}
}

// PoliciesChanged re-paces, by the policies in force now, the jobs this
// process's tenures hold back for their tenants' pace (queue.PolicyListener).
func (s *Store) PoliciesChanged() {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	for c := range s.consumers {
		for _, o := range c.owned() {
			o.repaceHeld()
		}
	}
}

// sleep waits d on the store's clock, or until wake has a value; false if
// stop came first.
func (s *Store) sleep(stop context.Context, d time.Duration, wake <-chan struct{}) bool {
	var after <-chan time.Time
	if s.clock != nil {
		after = s.clock.After(d)
	} else {
		t := time.NewTimer(d)
		defer t.Stop()
		after = t.C
	}
	select {
	case <-after:
		return true
	case <-wake:
		return true
	case <-stop.Done():
		return false
	}
}
