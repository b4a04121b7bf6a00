package redis

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
)

// consumer is one Consume call: this worker's share of the partitions.
type consumer struct {
	s    *Store
	h    queue.Handler
	lead time.Duration
	// sending bounds the jobs handed to h and not yet finished, across
	// the partitions (ConsumeOptions.Concurrency).
	sending chan struct{}
	loading chan struct{}   // bounds the partitions loading at once (owned.load)
	stop    context.Context // Consume's
	mgr     *owner.Manager

	// polling: a poll of the arrivals is under way (lines taken from
	// Redis may not be scheduled yet).
	polling atomic.Bool

	mu     sync.Mutex
	parts  map[int]*owned // the partitions owned now
	warned time.Time      // when the poller last said it cannot read (its goroutine's)
	// running counts the owned partitions' goroutines, which may outlive
	// their tenure a little (a send being written when it was lost).
	running sync.WaitGroup
}

// Consume implements queue.Store: this process joins the partitions'
// owners (package owner: leases, epochs, balancing), and for each
// partition it owns it paces the jobs in memory and hands each to h at its
// slot (owned.go). Beside them one poller reads every owned partition's
// arrivals. When ctx ends it hands its partitions over cleanly: sends not
// yet written go back to waiting, those being written are recorded, and
// only then are the leases released.
func (s *Store) Consume(ctx context.Context, h queue.Handler, opts queue.ConsumeOptions) error {
	c := &consumer{s: s, h: h, lead: cmp.Or(opts.Lead, queue.DefaultLead), stop: ctx,
		sending: make(chan struct{}, cmp.Or(opts.Concurrency, 1024)), loading: make(chan struct{}, 4), parts: map[int]*owned{}}
	mgr, err := owner.New(owner.Options{
		Client: s.rdb, Partitions: s.partitions, WorkerID: s.workerID,
		Lease: s.timing.Lease, Balance: s.timing.Balance, Logger: s.log,
		Acquired: c.acquired, Lost: c.lost, Drain: c.drain,
	})
	if err != nil {
		return err
	}
	c.mgr = mgr
	s.addConsumer(c)
	defer s.removeConsumer(c)
	// Not ctx: a cancelled one abandons the leases as a crash would. Stop
	// below hands them over instead.
	if err := mgr.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	polled, measured := make(chan struct{}), make(chan struct{})
	go func() { defer close(polled); c.pollArrivals(ctx) }()
	go func() {
		defer close(measured)
		if s.rclock != nil {
			s.rclock.keepMeasuring(ctx, s.rdb)
		}
	}()
	<-ctx.Done()
	mgr.Stop()
	<-polled
	<-measured
	c.running.Wait()
	return nil
}

// acquired starts a tenure of partition p (owner's callback: quick).
func (c *consumer) acquired(p int, epoch int64) {
	f, ok := c.mgr.Fence(p)
	if !ok || f.Epoch != epoch {
		return // lost already
	}
	o := newOwned(c, f)
	c.mu.Lock()
	c.parts[p] = o
	c.mu.Unlock()
	o.start()
}

// lost ends a tenure at once: nothing more is sent for p, and what the
// partition's goroutines still write is refused by the fence.
func (c *consumer) lost(p int) {
	if o := c.take(p); o != nil {
		o.abandon()
	}
}

// drain ends a tenure cleanly, before the lease is released.
func (c *consumer) drain(ctx context.Context, p int) {
	c.mu.Lock()
	o := c.parts[p]
	c.mu.Unlock()
	if o != nil {
		o.drain(ctx)
		c.take(p)
	}
}

func (c *consumer) take(p int) *owned {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.parts[p]
	delete(c.parts, p)
	return o
}

func (c *consumer) owned() []*owned {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*owned, 0, len(c.parts))
	for _, o := range c.parts {
		out = append(out, o)
	}
	return out
}

// resumed wakes the held jobs of tenant, if this worker owns them.
func (c *consumer) resumed(tenant string) {
	c.mu.Lock()
	o := c.parts[c.s.partOf(tenant)]
	c.mu.Unlock()
	if o != nil {
		o.wakeHeld(tenant)
	}
}

// arrivalsBatch is the most lines one poll takes from one partition.
const arrivalsBatch = 1000

var (
	//go:embed arrivals.lua
	arrivalsLua    string
	arrivalsScript = newScript("arrivals.lua", owner.FenceLua+arrivalsLua, false)
)

// pollArrivals reads the arrivals of every partition owned, in one
// pipelined round trip: every Timing.Poll while there are none; after a
// poll that found some, again after pollGather (at once after a full
// batch: more are waiting). Not at once whenever there were any: under a
// steady flow of admissions that polled every partition once per round
// trip, a few jobs each, and every claim and outcome batch after it was
// as small.
//
// A partition is read once its tenure has loaded it (takeover.lua). The
// lines of the jobs admitted before say the dispatch times they were
// admitted with, which the takeover may have moved since; read before the
// load, they were scheduled at those times beside the loaded ones, claimed
// early, and moved the tenant's pace past jobs due before them: a busy CI
// run of TestRedisFaultsBetweenWorkerAndRedis saw a tenant's queue one
// send longer than its schedule, and a job admitted a second later
// promised one interval too soon. After the load, a line of a job it
// loaded is known and skipped.
func (c *consumer) pollArrivals(ctx context.Context) {
	for ctx.Err() == nil {
		parts := slices.DeleteFunc(c.owned(), func(o *owned) bool { return !o.isLoaded() })
		found, full := false, false
		if len(parts) > 0 {
			c.polling.Store(true)
			found, full = c.pollOnce(ctx, parts)
			c.polling.Store(false)
		}
		if full {
			continue
		}
		wait := c.s.timing.Poll
		if found {
			wait = min(wait, pollGather)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// pollGather is how long the poller lets arrivals gather after a poll
// that found some: a few milliseconds of a job's start lag for batches
// several times larger under load.
const pollGather = 5 * time.Millisecond

// arrivalsReply is arrivals.lua's answer: the lines it took.
type arrivalsReply struct{ Lines []string }

func (a *arrivalsReply) Decode(r *luascript.Reply) { a.Lines = r.Rest() }

// pollOnce reads each partition's arrivals once, fenced (arrivals.lua): a
// tenure lost while this worker was frozen or cut off takes nothing, so
// the new owner sees every line. found reports any, full a partition that
// gave arrivalsBatch lines (it may have more).
func (c *consumer) pollOnce(ctx context.Context, parts []*owned) (found, full bool) {
	calls := make([]luascript.Call, len(parts))
	for i, o := range parts {
		calls[i] = luascript.Call{Keys: o.fence.Keys(o.k.arrivals()), Args: o.fence.Args(arrivalsBatch)}
	}
	reps, errs := luascript.RunEachInto[arrivalsReply](ctx, arrivalsScript, c.s.rdb, calls)
	for i, o := range parts {
		switch err := errs[i]; {
		case err == nil:
		case errors.Is(o.fence.Err(err), owner.ErrFenced):
			continue // lost: the owner's callback ends the tenure
		default:
			if ctx.Err() == nil && time.Since(c.warned) >= time.Second { // not 50 lines a second while Redis is away
				c.warned = time.Now()
				c.s.log.Warn("cannot read the partitions' arrivals; trying again", "err", err)
			}
			continue
		}
		if lines := reps[i].Lines; len(lines) > 0 {
			found = true
			o.arrive(lines)
			full = full || len(lines) >= arrivalsBatch
		}
	}
	return found, full
}

// parseArrival reads one line of a partition's arrivals (enqueue.lua's
// "id dispatch_at tenant").
func parseArrival(line string) (id string, at time.Time, tenant string, ok bool) {
	id, rest, ok1 := strings.Cut(line, " ")
	us, tenant, ok2 := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok1 || !ok2 || err != nil {
		return "", time.Time{}, "", false
	}
	return id, fromMicros(n), tenant, true
}

// Ready reports whether every partition has an owner and the partitions
// this process owns are loaded: jobs due now are handed over at once. A
// worker on a new Redis takes about a lease to get there (a partition
// Redis has never seen is held vacant for one lease). Tests and readiness
// probes ask it.
func (s *Store) Ready(ctx context.Context) bool {
	_, ok := s.tenures(ctx)
	return ok
}

// tenures is this process's tenures of the partitions, all loaded; ok is
// false while a partition has no owner, or one this worker holds in Redis
// is not a loaded tenure here yet (its acquired callback has not run, or
// its takeover is still reading it). Partitions of other workers are
// theirs to answer for.
func (s *Store) tenures(ctx context.Context) (parts []*owned, ok bool) {
	leases, err := owner.ReadLeases(ctx, s.rdb, s.partitions)
	if err != nil {
		return nil, false
	}
	s.consumersMu.Lock()
	mine := map[int]*owned{}
	ids := map[string]bool{} // this process's workers (one per Consume)
	for c := range s.consumers {
		ids[c.mgr.ID()] = true
		for _, o := range c.owned() {
			mine[o.fence.Partition] = o
		}
	}
	s.consumersMu.Unlock()
	for _, l := range leases {
		o := mine[l.Partition]
		switch {
		case l.Worker == "":
			return nil, false // nobody sends its jobs yet
		case ids[l.Worker] && (o == nil || o.fence.Epoch != l.Epoch || !o.isLoaded()):
			return nil, false
		case o != nil:
			parts = append(parts, o)
		}
	}
	return parts, true
}

// Handed is how many times this store's consumers have called their
// handler: a test that moves a fake clock waits until every call has read
// it (see CaughtUp).
func (s *Store) Handed() int64 { return s.handed.Load() }

// CaughtUp reports whether this store's consumers have read every arrival
// of the partitions they own and handed over every job due by now (the
// store's clock) plus the lead. A test that moves a fake clock asks it
// before each move, so that the clock never runs ahead of work that takes
// real time here (a poll, a claim's round trip): on a busy machine that
// work is slow, and a clock moved meanwhile would make a job handed over
// on time look late.
func (s *Store) CaughtUp(ctx context.Context) bool { return s.behind(ctx) == "" }

// behind says what keeps CaughtUp from holding ("" nothing), for a test
// that waited for it in vain.
func (s *Store) behind(ctx context.Context) string {
	parts, ok := s.tenures(ctx)
	if !ok {
		return "a partition without a loaded tenure"
	}
	pipe := s.rdb.Pipeline()
	lens := make([]*goredis.IntCmd, len(parts))
	for i, o := range parts {
		if why := o.behind(); why != "" {
			return why
		}
		lens[i] = pipe.LLen(ctx, o.k.arrivals())
	}
	if _, err := pipe.Exec(ctx); err != nil && len(parts) > 0 {
		return fmt.Sprintf("cannot count the arrivals: %v", err)
	}
	for i, n := range lens {
		if n.Val() > 0 {
			return fmt.Sprintf("partition %d has %d arrivals to read", parts[i].fence.Partition, n.Val())
		}
	}
	// Asked again after the arrivals were counted: lines a poll took
	// before that are scheduled by now, or the poll is still under way.
	s.consumersMu.Lock()
	for c := range s.consumers {
		if c.polling.Load() {
			s.consumersMu.Unlock()
			return "a poll under way"
		}
	}
	s.consumersMu.Unlock()
	for _, o := range parts {
		if why := o.behind(); why != "" {
			return why
		}
	}
	return ""
}

// Held is how many partitions this process's consumers hold, of the
// store's P (queue.Ownership).
func (s *Store) Held() (held, partitions int) {
	return s.heldCount(), s.partitions
}

func (s *Store) heldCount() int {
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	n := 0
	for c := range s.consumers {
		n += len(c.owned())
	}
	return n
}

// Wrote implements queue.WriteNoter: the request of claimed job j is
// written (the owner of its partition counts the jobs behind a late write
// by it).
func (s *Store) Wrote(j queue.Job) {
	part := s.partOf(j.Tenant)
	s.consumersMu.Lock()
	defer s.consumersMu.Unlock()
	for c := range s.consumers {
		c.mu.Lock()
		o := c.parts[part]
		c.mu.Unlock()
		if o != nil {
			o.wrote(j.ID)
		}
	}
}
