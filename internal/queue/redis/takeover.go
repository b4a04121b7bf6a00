package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
)

var (
	//go:embed takeover.lua
	takeoverLua    string
	takeoverScript = newScript("takeover.lua", owner.FenceLua+takeoverLua, true)
)

// takeoverTenants is how many tenants one run of takeover.lua looks at.
const takeoverTenants = 200

// takenTenant is what takeover.lua found of one tenant.
type takenTenant struct {
	Name  string
	Pause leaky.Pause
	// Next is the earliest its next send may go: the last owner may have
	// sent until just before it.
	Next    time.Time
	Waiting []waitingJob
}

type waitingJob struct {
	ID   string
	Slot time.Time // tenant time
	// Missed is the job's deadline if its dispatch time is past it, or its
	// tenant is held (zero if not): it is to be expired then (held: if
	// the hold lasts).
	Missed time.Time
}

func (t *takenTenant) Decode(r *luascript.Reply) {
	t.Name = r.Str()
	t.Pause = leaky.Pause{Shift: r.Duration(), Until: r.Time(), Held: r.Time()}
	t.Next = r.Time()
	for r.More() {
		id, score := r.Str(), r.Str()
		slot, err := strconv.ParseFloat(score, 64)
		if err != nil {
			r.Fail(fmt.Errorf("job %s: slot %q: %w", id, score, err))
			return
		}
		missed := r.Time()
		t.Waiting = append(t.Waiting, waitingJob{ID: id, Slot: fromMicros(int64(slot)), Missed: missed})
	}
}

type takeoverReply struct {
	Now     time.Time
	Taken   int // jobs the last owner was sending, taken back
	Tenants []takenTenant
}

func (t *takeoverReply) Decode(r *luascript.Reply) {
	t.Now = r.Time()
	t.Taken = int(r.Int())
	r.Each(func(r *luascript.Reply) {
		var one takenTenant
		one.Decode(r)
		t.Tenants = append(t.Tenants, one)
	})
}

// takeOver is a new owner's first look at partition k under fence f: the
// jobs the last owner was sending taken back, and every tenant with jobs,
// with what waits; a tenant whose jobs' time passed unsent has its tat
// moved past them (takeover.lua).
func (s *Store) takeOver(ctx context.Context, f owner.Fence, k partKeys) (now time.Time, taken int, tenants []takenTenant, err error) {
	names, err := s.rdb.ZRange(ctx, k.active(), 0, -1).Result()
	if err != nil {
		return now, 0, nil, queue.Unavailable(err)
	}
	// And the tenants without jobs whose next send may still be to come:
	// their schedules start from it too (takeover.lua). Claims keep the
	// set to those.
	recent, err := s.rdb.ZRange(ctx, k.recent(), 0, -1).Result()
	if err != nil {
		return now, 0, nil, queue.Unavailable(err)
	}
	if len(recent) > 0 {
		seen := make(map[string]bool, len(names))
		for _, name := range names {
			seen[name] = true
		}
		for _, name := range recent {
			if !seen[name] {
				names = append(names, name)
			}
		}
	}
	for first := true; first || len(names) > 0; first = false {
		n := min(len(names), takeoverTenants)
		args := takeoverArgs(f, s.now(), k, first, s.idle, names[:n], s.policy)
		var r takeoverReply
		if err := takeoverScript.Run(ctx, s.rdb, []string{f.Key(), k.sending()}, args, &r); err != nil {
			return now, 0, nil, f.Err(err)
		}
		now, taken, tenants, names = r.Now, taken+r.Taken, append(tenants, r.Tenants...), names[n:]
	}
	return now, taken, tenants, nil
}

// takeoverArgs is ARGV of a run of takeover.lua under fence f at now
// (microseconds, 0: Redis's TIME) for names, each under its policy;
// takeBack on the first run of a tenure.
func takeoverArgs(f owner.Fence, now int64, k partKeys, takeBack bool, idle time.Duration, names []string, policy func(string) leaky.Policy) []any {
	flag := "0"
	if takeBack {
		flag = "1"
	}
	args := []any{f.Token(), now, k.tag, flag, idle.Milliseconds()}
	for _, name := range names {
		p := policy(name)
		args = append(args, name, usCeil(p.Interval), usCeil(p.Tolerance()), len(p.Windows))
		for _, w := range p.Windows {
			args = append(args, w.String(), w.N, usCeil(w.Length))
		}
	}
	return args
}
