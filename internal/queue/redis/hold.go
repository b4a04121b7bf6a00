package redis

import (
	"context"
	_ "embed"
	"time"

	"throttler/internal/queue"
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
	k := keysOf(shardOf(tenant))
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

// resumed is closed when this process resumes tenant (other processes'
// resumes are seen at the next recheck of the claim).
func (s *Store) resumed(tenant string) <-chan struct{} {
	s.resumesMu.Lock()
	defer s.resumesMu.Unlock()
	ch, ok := s.resumes[tenant]
	if !ok {
		ch = make(chan struct{})
		s.resumes[tenant] = ch
	}
	return ch
}

// wakeResumed wakes this process's tasks of tenant, waiting out a hold.
func (s *Store) wakeResumed(tenant string) {
	s.resumesMu.Lock()
	defer s.resumesMu.Unlock()
	if ch, ok := s.resumes[tenant]; ok {
		close(ch)
		delete(s.resumes, tenant)
	}
}
