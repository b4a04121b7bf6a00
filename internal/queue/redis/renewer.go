package redis

import (
	"context"
	_ "embed"
	"sync"

	"throttler/internal/startstop"
)

var (
	//go:embed lease.lua
	leaseLua    string
	leaseScript = newScript("lease.lua", leaseLua, true)
)

// renewer renews, every quarter of a lease, the leases of the jobs this
// process holds (waiting for their slot, or being sent), so that the
// recoverer of no other worker takes them back. Consume runs it until its
// asynq servers have shut down.
type renewer struct {
	startstop.Periodic
	s    *Store
	held *heldJobs
}

func newRenewer(s *Store, held *heldJobs) *renewer {
	r := &renewer{s: s, held: held}
	r.Periodic = startstop.Periodic{Name: "lease renewer", Every: s.timing.Lease / 4, Run: r.exec}
	return r
}

func (r *renewer) exec(stop context.Context) {
	s := r.s
	ctx, cancel := context.WithTimeout(stop, s.timing.Lease/4)
	defer cancel()
	for shard, ids := range r.held.byShard() {
		args := append([]any{s.now(), s.timing.Lease.Microseconds()}, ids...)
		if err := leaseScript.Run(ctx, s.rdb, []string{keysOf(shard).inflight()}, args, nil); err != nil && stop.Err() == nil {
			s.markTrouble()
			s.log.Warn("cannot renew the leases of jobs being sent", "err", err)
		}
	}
}

// heldJobs are the jobs this process holds. Counted: two tasks of one job
// can be held at once (an old one asynq runs again, and the job's new one).
type heldJobs struct {
	mu  sync.Mutex
	ids map[string]heldJob
}

type heldJob struct{ shard, n int }

func newHeldJobs() *heldJobs { return &heldJobs{ids: map[string]heldJob{}} }

func (hj *heldJobs) add(id string, shard int) {
	hj.mu.Lock()
	h := hj.ids[id]
	hj.ids[id] = heldJob{shard, h.n + 1}
	hj.mu.Unlock()
}

func (hj *heldJobs) remove(id string) {
	hj.mu.Lock()
	if h := hj.ids[id]; h.n > 1 {
		hj.ids[id] = heldJob{h.shard, h.n - 1}
	} else {
		delete(hj.ids, id)
	}
	hj.mu.Unlock()
}

// byShard lists the ids held, by shard.
func (hj *heldJobs) byShard() map[int][]any {
	hj.mu.Lock()
	defer hj.mu.Unlock()
	out := map[int][]any{}
	for id, h := range hj.ids {
		out[h.shard] = append(out[h.shard], id)
	}
	return out
}
