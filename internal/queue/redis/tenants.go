package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// tenantState is a tenant's hash, read.
type tenantState struct {
	rec             rules.Record // without its windows (lists of their own)
	depth, inFlight int
	scheduled       int       // booked for their not_before (sched)
	ownerAt         time.Time // when its partition gets an owner (zero: it has one)
}

// tenantFields are the fields of a tenant's hash that parseTenant reads.
var tenantFields = []string{"tat", "shift", "until", "held", "depth", "inflight", "accepted", "rejected", "delivered", "failed", "cancelled", "expired", "booked", "behind", "scheduled"}

// parseTenant reads HMGET's answer for tenantFields (a field not there
// reads 0).
func parseTenant(v []any) tenantState {
	n := func(i int) int64 {
		if i >= len(v) {
			return 0
		}
		s, _ := v[i].(string)
		x, _ := strconv.ParseInt(s, 10, 64)
		return x
	}
	field := func(i int) string {
		if i >= len(v) {
			return ""
		}
		s, _ := v[i].(string)
		return s
	}
	return tenantState{
		rec: rules.Record{
			TAT:      fromMicros(n(0)),
			Pause:    leaky.Pause{Shift: time.Duration(n(1)) * time.Microsecond, Until: fromMicros(n(2)), Held: fromMicros(n(3))},
			Accepted: n(6), Rejected: n(7), Delivered: n(8), Failed: n(9), Cancelled: n(10), Expired: n(11),
			Booked: parseBooked(field(12)),
			Behind: fromMicros(n(13)),
		},
		depth: int(n(4)), inFlight: int(n(5)), scheduled: int(n(14)),
	}
}

// A tenant's bookings (rules.Record.Booked) live in its hash's
// "booked" field, soonest first: "slot cost id" per booking (slot in
// microseconds, tenant time), joined by ";" (lib.lua's booked_parse).
// Most tenants have none, and a hash field costs an admission nothing
// more to read.

// parseBooked reads a "booked" field (an entry it cannot read is left
// out: a booking only ever spaces sends).
func parseBooked(f string) []rules.Booking {
	if f == "" {
		return nil
	}
	var out []rules.Booking
	for e := range strings.SplitSeq(f, ";") {
		parts := strings.Fields(e)
		if len(parts) != 3 {
			continue
		}
		us, err1 := strconv.ParseInt(parts[0], 10, 64)
		cost, err2 := strconv.Atoi(parts[1])
		if err1 != nil || err2 != nil || us > math.MaxInt64/1000 || us < math.MinInt64/1000 {
			continue
		}
		if cost <= 1 {
			cost = 0
		}
		out = append(out, rules.Booking{Slot: us * 1000, Cost: cost, Job: parts[2]})
	}
	return out
}

// formatBooked is the "booked" field of bookings ("" for none).
func formatBooked(bookings []rules.Booking) string {
	var b strings.Builder
	for i, bk := range bookings {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%d %d %s", micros(time.Unix(0, bk.Slot)), max(bk.Cost, 1), bk.Job)
	}
	return b.String()
}

// parseRecent reads a window's list: the slots of its last sends, in
// microseconds.
func parseRecent(list []string) leaky.Recent {
	out := make(leaky.Recent, 0, len(list))
	for _, us := range list {
		n, _ := strconv.ParseInt(us, 10, 64)
		out = append(out, time.UnixMicro(n))
	}
	return out
}

// Tenant implements queue.Store.
func (s *Store) Tenant(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	part := s.partOf(tenant)
	v, err := s.rdb.HMGet(ctx, keysOf(part).tenant(tenant), tenantFields...).Result()
	if err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return queue.TenantStatus{}, err
	}
	ts := parseTenant(v)
	if ts.ownerAt, err = s.ownerAt(ctx, part, now); err != nil {
		return queue.TenantStatus{}, err
	}
	return s.status(ctx, tenant, ts, now)
}

// ownerAt is when partition part gets an owner, as enqueue.lua reckons
// it (zero: it has one): the end of a vacancy, or a lease after now for
// a partition Redis has never seen; plus ownerLag.
func (s *Store) ownerAt(ctx context.Context, part int, now time.Time) (time.Time, error) {
	pipe := s.rdb.Pipeline()
	lease := pipe.Get(ctx, owner.LeaseKey(part))
	ttl := pipe.PTTL(ctx, owner.LeaseKey(part))
	epoch := pipe.Exists(ctx, owner.EpochKey(part))
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, goredis.Nil) {
		return time.Time{}, queue.Unavailable(err)
	}
	switch v, err := lease.Result(); {
	case err == nil && v == "":
		return now.Add(max(ttl.Val(), 0) + ownerLag), nil
	case errors.Is(err, goredis.Nil) && epoch.Val() == 0:
		return now.Add(s.timing.Lease + ownerLag), nil
	}
	return time.Time{}, nil
}

// status is what ts says of tenant name at now. Its expected delay counts
// its windows and its downstream's ceiling, as admission does.
func (s *Store) status(ctx context.Context, name string, ts tenantState, now time.Time) (queue.TenantStatus, error) {
	p := s.policy(name)
	pz := ts.rec.Pause
	rec := ts.rec
	if len(p.Windows) > 0 {
		k := keysOf(s.partOf(name))
		recent := make([]leaky.Recent, len(p.Windows))
		for i, w := range p.Windows {
			l, err := s.rdb.LRange(ctx, k.window(name, w), 0, -1).Result()
			if err != nil {
				return queue.TenantStatus{}, queue.Unavailable(err)
			}
			recent[i] = parseRecent(l)
		}
		rec.SetRecent(p, recent)
	}
	_, ceiling := s.ceiling(name)
	depth := max(ts.depth, 0)
	paused, until := pz.Paused(now)
	return queue.TenantStatus{
		Tenant: name, QueueDepth: depth, InFlight: max(ts.inFlight, 0), OwnerAt: ts.ownerAt, Scheduled: max(ts.scheduled, 0),
		ExpectedDelay: rules.ExpectedDelay(rec, now, p, ceiling, depth, ts.ownerAt),
		LimitedBy:     rules.LimitOf(rec, now, p, ceiling, depth),
		Paused:        paused, PausedUntil: until, Held: !pz.Held.IsZero(),
		Accepted: ts.rec.Accepted, Rejected: ts.rec.Rejected, Delivered: ts.rec.Delivered,
		Failed: ts.rec.Failed, Cancelled: ts.rec.Cancelled, Expired: ts.rec.Expired,
	}, nil
}

// Tenants implements queue.Store.
func (s *Store) Tenants(ctx context.Context, offset, limit int) ([]queue.TenantStatus, error) {
	page, err := s.activePage(ctx, offset, limit)
	if err != nil || len(page) == 0 {
		return nil, err
	}
	// One pipeline for the page: a scrape of /metrics reads every busy
	// tenant.
	cmds := make([]*goredis.SliceCmd, len(page))
	_, err = s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, name := range page {
			cmds[i] = p.HMGet(ctx, keysOf(s.partOf(name)).tenant(name), tenantFields...)
		}
		return nil
	})
	if err != nil {
		return nil, queue.Unavailable(err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]queue.TenantStatus, 0, len(page))
	owners := map[int]time.Time{}
	for i, name := range page {
		ts, part := parseTenant(cmds[i].Val()), s.partOf(name)
		at, ok := owners[part]
		if !ok {
			if at, err = s.ownerAt(ctx, part, now); err != nil {
				return nil, err
			}
			owners[part] = at
		}
		ts.ownerAt = at
		st, err := s.status(ctx, name, ts, now)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// activePage names the tenants with jobs, deepest first, from offset, at
// most limit (0: all).
func (s *Store) activePage(ctx context.Context, offset, limit int) ([]string, error) {
	type entry struct {
		name string
		n    float64
	}
	var all []entry
	for part := range s.partitions {
		zs, err := s.rdb.ZRangeWithScores(ctx, keysOf(part).active(), 0, -1).Result()
		if err != nil {
			return nil, queue.Unavailable(err)
		}
		for _, z := range zs {
			if name, ok := z.Member.(string); ok && z.Score > 0 {
				all = append(all, entry{name, z.Score})
			}
		}
	}
	slices.SortFunc(all, func(a, b entry) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.name, b.name))
	})
	if offset >= len(all) {
		return nil, nil
	}
	all = all[offset:]
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	names := make([]string, len(all))
	for i, e := range all {
		names[i] = e.name
	}
	return names, nil
}
