package metrics

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/startstop"
)

// Recent's defaults: a sample every 2 s, kept 5 minutes (150 samples), of
// the 100 deepest tenants.
const (
	RecentEveryDefault   = 2 * time.Second
	RecentWindowDefault  = 5 * time.Minute
	RecentTenantsDefault = 100
)

// Classes are the answer classes of throttler_attempts_total, in the order
// the status page shows them.
var Classes = []string{"2xx", "3xx", "4xx", "429", "5xx", "timeout", "connection_error"}

// RecentOptions configure Recent. Zero values take the defaults.
type RecentOptions struct {
	// Every is how often a sample is taken. Default RecentEveryDefault.
	Every time.Duration
	// Window is how long samples are kept. Default RecentWindowDefault.
	Window time.Duration
	// Tenants is how many of the deepest busy tenants each pass samples.
	// Default RecentTenantsDefault.
	Tenants int
}

// TenantSample is one tenant at one moment.
type TenantSample struct {
	At        time.Time
	Depth     int
	InFlight  int
	Delay     time.Duration
	Delivered int64 // totals, as the store counts them
	Failed    int64
}

// DownstreamSample is one downstream at one moment, as this process has
// seen it (the counters are this process's attempts).
type DownstreamSample struct {
	At          time.Time
	Attempts    map[string]float64 // by class, totals
	Pushbacks   float64            // total
	Announced   float64            // total: holds its rate limit fields asked for
	BreakerOpen bool
}

// Recent keeps the last minutes of what the status page draws, in memory:
// per busy tenant its depth, expected delay and delivered total; per
// downstream its attempts by class, pushbacks and breaker. Memory is
// bounded and idle tenants cost nothing: each pass reads the Tenants
// deepest busy tenants (one store read, the same the page's first page
// makes), keeps a ring of samples for each, follows a tenant that has
// left that list until it has been idle for a whole window, and tracks at
// most 2*Tenants tenants (the longest idle are dropped first). The list is
// read at most once per 20 times what a read took (a store with a million
// busy tenants takes a while to list them): sampling takes at most about 5%
// of the store's time, and the samples grow further apart instead.
//
// Start it with Metrics.KeepRecent; safe for concurrent use.
type Recent struct {
	m                  *Metrics
	every, window      time.Duration
	keep, tenantsLimit int
	pass               startstop.Periodic

	mu          sync.Mutex
	tenants     map[string]*tenantTrack
	downstreams map[string]*ring[DownstreamSample]
	tenantEvery time.Duration // every, or more if reading the list is slow
	nextTenants time.Time     // the next pass that reads the tenants
}

// costShare: a pass that reads the tenants comes at most once per this
// many times what the last one took.
const costShare = 20

type tenantTrack struct {
	samples  ring[TenantSample]
	lastBusy time.Time
}

// KeepRecent starts sampling (the first sample at once) until the returned
// Recent is stopped; Recent() returns it meanwhile.
func (m *Metrics) KeepRecent(ctx context.Context, opts RecentOptions) *Recent {
	rc := &Recent{m: m, every: cmp.Or(opts.Every, RecentEveryDefault), window: cmp.Or(opts.Window, RecentWindowDefault),
		tenantsLimit: cmp.Or(opts.Tenants, RecentTenantsDefault),
		tenants:      map[string]*tenantTrack{}, downstreams: map[string]*ring[DownstreamSample]{}}
	rc.keep = max(2, int(rc.window/rc.every))
	rc.tenantEvery = rc.every
	rc.sample(ctx)
	rc.pass = startstop.Periodic{Name: "recent samples", Every: rc.every, Run: rc.sample}
	rc.pass.Start(ctx)
	m.recent.Store(rc)
	return rc
}

// Recent is the sampler KeepRecent started (nil: none).
func (m *Metrics) Recent() *Recent { return m.recent.Load() }

// Stop ends sampling and waits for a pass under way. The samples stay
// readable.
func (rc *Recent) Stop() { rc.pass.Stop() }

// Every is the time between samples of the tenants now (more than
// RecentOptions.Every if listing them is slow); Window how long samples
// are kept.
func (rc *Recent) Every() time.Duration {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.tenantEvery
}

func (rc *Recent) Window() time.Duration { return rc.window }

// Tenants returns the samples of the last window, oldest first, of those
// of names that are tracked.
func (rc *Recent) Tenants(names []string) map[string][]TenantSample {
	since := time.Now().Add(-rc.window)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string][]TenantSample, len(names))
	for _, n := range names {
		if tr, ok := rc.tenants[n]; ok {
			all := tr.samples.all()
			i := 0
			for i < len(all) && all[i].At.Before(since) {
				i++
			}
			out[n] = all[i:]
		}
	}
	return out
}

// Tracked is how many tenants have samples kept.
func (rc *Recent) Tracked() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.tenants)
}

// Downstreams returns each downstream's samples, oldest first.
func (rc *Recent) Downstreams() map[string][]DownstreamSample {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string][]DownstreamSample, len(rc.downstreams))
	for n, r := range rc.downstreams {
		out[n] = r.all()
	}
	return out
}

// sample takes one sample of every tracked tenant and every downstream. A
// store that cannot be read leaves a gap in the tenants' samples.
func (rc *Recent) sample(ctx context.Context) {
	now := time.Now()
	rc.sampleDownstreams(now)
	rc.mu.Lock()
	skip := now.Before(rc.nextTenants)
	rc.mu.Unlock()
	if !skip {
		rc.sampleTenants(ctx, now)
		took := time.Since(now)
		rc.mu.Lock()
		rc.tenantEvery = max(rc.every, costShare*took)
		// Half an interval early: the ticks that drive passes jitter.
		rc.nextTenants = now.Add(rc.tenantEvery - rc.every/2)
		rc.mu.Unlock()
	}
}

// sampleTenants reads the busiest tenants, and those followed that are no
// longer among them.
func (rc *Recent) sampleTenants(ctx context.Context, now time.Time) {
	busy, err := rc.m.store.Tenants(ctx, 0, rc.tenantsLimit)
	if err != nil {
		return
	}
	seen := make(map[string]bool, len(busy))
	for _, st := range busy {
		seen[st.Tenant] = true
	}
	// The tenants followed but not in the list now: read them one by one
	// (at most 2*tenantsLimit of them, see trim), or drop them once idle for
	// a whole window.
	rc.mu.Lock()
	var others []string
	for name, tr := range rc.tenants {
		if seen[name] {
			continue
		}
		if now.Sub(tr.lastBusy) > rc.window {
			delete(rc.tenants, name)
			continue
		}
		others = append(others, name)
	}
	rc.mu.Unlock()
	for _, name := range others {
		st, err := rc.m.store.Tenant(ctx, name)
		if err != nil {
			return
		}
		busy = append(busy, st)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, st := range busy {
		tr := rc.tenants[st.Tenant]
		if tr == nil {
			tr = &tenantTrack{samples: newRing[TenantSample](rc.keep)}
			rc.tenants[st.Tenant] = tr
		}
		if st.QueueDepth > 0 || st.InFlight > 0 || st.Scheduled > 0 {
			tr.lastBusy = now
		}
		tr.samples.push(TenantSample{At: now, Depth: st.QueueDepth, InFlight: st.InFlight, Delay: st.ExpectedDelay,
			Delivered: st.Delivered, Failed: st.Failed})
	}
	rc.trim()
}

// trim drops the longest idle tenants past 2*tenantsLimit. rc.mu held.
func (rc *Recent) trim() {
	over := len(rc.tenants) - 2*rc.tenantsLimit
	if over <= 0 {
		return
	}
	names := make([]string, 0, len(rc.tenants))
	for n := range rc.tenants {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return rc.tenants[a].lastBusy.Compare(rc.tenants[b].lastBusy) })
	for _, n := range names[:over] {
		delete(rc.tenants, n)
	}
}

func (rc *Recent) sampleDownstreams(now time.Time) {
	counts := rc.m.downstreamCounts()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for name, s := range counts {
		r := rc.downstreams[name]
		if r == nil {
			nr := newRing[DownstreamSample](rc.keep)
			r = &nr
			rc.downstreams[name] = r
		}
		s.At = now
		r.push(*s)
	}
}

// downstreamCounts reads, by downstream, this process's attempts by class,
// its pushbacks and its breaker, as a scrape of /metrics would.
func (m *Metrics) downstreamCounts() map[string]*DownstreamSample {
	out := map[string]*DownstreamSample{}
	get := func(ds string) *DownstreamSample {
		s := out[ds]
		if s == nil {
			s = &DownstreamSample{Attempts: map[string]float64{}}
			out[ds] = s
		}
		return s
	}
	// A registry of the two counters alone: a Gather of it reads no store.
	fams, _ := m.perDownstream.Gather()
	for _, fam := range fams {
		for _, mt := range fam.GetMetric() {
			var ds, class string
			for _, lp := range mt.GetLabel() {
				switch lp.GetName() {
				case "downstream":
					ds = lp.GetValue()
				case "class":
					class = lp.GetValue()
				}
			}
			switch fam.GetName() {
			case "throttler_attempts_total":
				get(ds).Attempts[class] = mt.GetCounter().GetValue()
			case "throttler_pushbacks_total":
				get(ds).Pushbacks = mt.GetCounter().GetValue()
			case "throttler_announced_holds_total":
				get(ds).Announced = mt.GetCounter().GetValue()
			}
		}
	}
	if f := m.breakers.Load(); f != nil {
		for ds, open := range (*f)() {
			get(ds).BreakerOpen = open
		}
	}
	return out
}

// ring keeps the last len(buf) values pushed.
type ring[T any] struct {
	buf  []T
	next int
	full bool
}

func newRing[T any](n int) ring[T] { return ring[T]{buf: make([]T, n)} }

func (r *ring[T]) push(v T) {
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

// all is the values, oldest first (a copy).
func (r *ring[T]) all() []T {
	if !r.full {
		return slices.Clone(r.buf[:r.next])
	}
	return append(slices.Clone(r.buf[r.next:]), r.buf[:r.next]...)
}
