package owner

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
)

// balance is the balancer's pass (every Balance): the heartbeat, then
// this worker's share, then take free partitions up to it or give the
// surplus back.
func (m *Manager) balance(ctx context.Context) {
	m.lockPass()
	defer m.unlockPass()
	P := m.o.Partitions
	rep, err := members(ctx, m.rdb, P, m.o.WorkerID, m.o.HeartbeatTTL)
	if ctx.Err() != nil {
		return
	}
	m.trouble.report(m.log, "send the heartbeat", err)
	if err != nil {
		return
	}
	if !slices.Equal(rep.Live, m.live) {
		m.log.Info("the live workers changed", "live", len(rep.Live), "was", len(m.live))
		m.live = rep.Live
	}
	share := shareOf(m.o.WorkerID, rep.Live, P)
	err = checkPartitions(P, rep.Recorded)
	if err != nil {
		// Redis lost its count, and a process configured otherwise
		// recorded its own: this worker hashes tenants another way than
		// Redis's, so it must own nothing (members.lua left it out).
		share = 0
	}
	if (err != nil) != m.mismatch {
		m.mismatch = err != nil
		if err != nil {
			m.log.Error("giving back every partition and taking none", "err", err)
		} else {
			m.log.Info("Redis records this worker's partition count again")
		}
	}
	held := 0
	m.mu.Lock()
	for _, t := range m.held {
		if !t.draining {
			held++
		}
	}
	m.mu.Unlock()
	switch {
	case held > share:
		m.log.Info("giving back partitions over this worker's share", "held", held, "share", share, "live", len(rep.Live))
		m.giveBack(m.pick(held - share))
	case held < share:
		i, _ := slices.BinarySearch(rep.Live, m.o.WorkerID)
		m.take(ctx, share-held, i*P/len(rep.Live))
	}
}

// pick marks n of the partitions held (n < 0: all) as draining, the
// highest-numbered first, and returns them.
func (m *Manager) pick(n int) []Held {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ps []int
	for p, t := range m.held {
		if !t.draining {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	slices.Reverse(ps)
	if n >= 0 && n < len(ps) {
		ps = ps[:n]
	}
	out := make([]Held, len(ps))
	for i, p := range ps {
		m.held[p].draining = true
		out[i] = Held{Partition: p, Epoch: m.held[p].epoch, Draining: true}
	}
	return out
}

// giveBack hands the partitions over, all at once, and returns when
// every one is released.
func (m *Manager) giveBack(hs []Held) {
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() { m.handOver(h) })
	}
	wg.Wait()
}

// handOver drains a partition and only then releases its lease: once
// Drain has returned nothing of it is being sent here, so the next owner
// may start at once. The lease is renewed meanwhile (it is still held).
func (m *Manager) handOver(h Held) {
	ctx, cancel := context.WithTimeout(context.Background(), m.o.DrainTimeout)
	m.o.Drain(ctx, h.Partition)
	cancel()
	// Forget the tenure before the release, so that no renewal revives
	// it. If it was lost meanwhile (Lost was called), the lease may still
	// be this worker's in Redis: Drain has returned, so releasing it is
	// safe and saves the next owner the wait.
	m.mu.Lock()
	if t := m.held[h.Partition]; t != nil && t.epoch == h.Epoch {
		delete(m.held, h.Partition)
	}
	m.mu.Unlock()
	ctx, cancel = context.WithTimeout(context.Background(), m.o.Renew)
	defer cancel()
	var rep renewReply
	err := releaseScript.Run(ctx, m.rdb, []string{leaseKey(h.Partition)}, []any{token(m.o.WorkerID, h.Epoch)}, &rep)
	switch {
	case err != nil:
		m.log.Warn("drained a partition but cannot release its lease; it lapses by itself", "partition", h.Partition, "err", err)
	case rep.OK:
		m.log.Info("gave back a partition", "partition", h.Partition, "epoch", h.Epoch)
	default:
		m.log.Info("drained a partition whose lease had already lapsed", "partition", h.Partition, "epoch", h.Epoch)
	}
}

// take tries n free partitions, looking from partition from on (workers
// start at different places, so that those looking at once mostly try
// different partitions). Held ones are never taken: their owner gives
// them back, or they lapse. One held vacant is taken the moment its
// vacancy ends (retakeAt), if this worker is under its share then.
func (m *Manager) take(ctx context.Context, n, from int) {
	free, vacant, err := freePartitions(ctx, m.rdb, m.o.Partitions)
	if err != nil {
		if ctx.Err() == nil {
			m.trouble.report(m.log, "read the partition leases", err)
		}
		return
	}
	// Vacancies read together mostly began together (one worker's
	// vacating pass): taken together, at the end of the last of them.
	var ps []int
	var last time.Duration
	for p, left := range vacant {
		ps, last = append(ps, p), max(last, left)
	}
	if len(ps) > 0 {
		slices.Sort(ps)
		m.retakeAt(ps, time.Now().Add(last))
	}
	i, _ := slices.BinarySearch(free, from)
	free = slices.Concat(free[i:], free[:i])
	m.acquire(ctx, free[:min(n, len(free))])
}

// acquire tries to take each of the partitions ps.
func (m *Manager) acquire(ctx context.Context, ps []int) {
	if len(ps) == 0 {
		return
	}
	calls := make([]luascript.Call, len(ps))
	for i, p := range ps {
		calls[i] = luascript.Call{Keys: []string{leaseKey(p), epochKey(p)}, Args: []any{m.o.WorkerID, ms(m.o.Lease)}}
	}
	sent := time.Now()
	reps, errs := luascript.RunEachInto[acquireReply](ctx, acquireScript, m.rdb, calls)
	var vacated []int
	for i, p := range ps {
		switch {
		case errs[i] != nil:
			if ctx.Err() == nil {
				m.log.Warn("cannot acquire a partition", "partition", p, "err", errs[i])
			}
		case reps[i].Code == acquireTaken:
			m.adopt(p, reps[i].Epoch, sent)
		case reps[i].Code == acquireVacated:
			m.log.Info("a partition new to Redis (or whose keys Redis lost) is held vacant for one lease", "partition", p, "epoch", reps[i].Epoch)
			vacated = append(vacated, p)
		}
	}
	if len(vacated) > 0 {
		// Redis set them at or after sent; their answers came now, no
		// earlier than that.
		m.retakeAt(vacated, time.Now().Add(m.o.Lease))
	}
}

// adopt starts a tenure acquired by a request sent at sent, and tells the
// user.
func (m *Manager) adopt(p int, epoch int64, sent time.Time) {
	m.cbMu.Lock()
	defer m.cbMu.Unlock()
	if m.ctx.Err() != nil {
		return // abandoned meanwhile: the watchdog would tell no Lost; the lease lapses
	}
	deadline := sent.Add(m.o.Lease - m.o.Margin)
	if !time.Now().Before(deadline) {
		m.log.Warn("acquired a partition too late to use it; its lease lapses", "partition", p, "epoch", epoch)
		return
	}
	m.mu.Lock()
	m.held[p] = &tenure{epoch: epoch, deadline: deadline}
	m.mu.Unlock()
	m.pokeWatch()
	m.log.Info("acquired a partition", "partition", p, "epoch", epoch)
	m.o.Acquired(p, epoch)
}
