package queue

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

// Buckets of the embedded store's file.
var (
	bucketJobs     = []byte("jobs")     // id -> Job without its payload (JSON)
	bucketPayloads = []byte("payloads") // id -> payload, written once
	bucketDue      = []byte("due")      // slot (tenant time, 8 bytes big endian ns) + id -> tenant: waiting jobs
	bucketDone     = []byte("done")     // finished_at + id -> nil: for the reaper
	bucketFailed   = []byte("failed")   // tenant + 0x00 + newest-first time + id -> nil
	bucketIdem     = []byte("idem")     // tenant + 0x00 + key -> id
	bucketTenants  = []byte("tenants")  // tenant -> tenantRecord (JSON)
	bucketMeta     = []byte("meta")     // "clean" -> "1" after a clean stop
)

var keyClean = []byte("clean")

// BoltOptions configure the embedded store; zero values take defaults.
type BoltOptions struct {
	Clock  clock.Clock // default clock.Real
	Policy PolicyFunc  // required
	// Ceiling gives a tenant's downstream ceiling (default: none).
	Ceiling CeilingFunc
	// OnExpired, if set, is told of each job that expires while waiting.
	OnExpired func(Job)
	// Retention is how long finished jobs are kept. Default 72h.
	Retention time.Duration
	// MaxBatchDelay is how long a write waits for others to share its
	// fsync. Default 1ms.
	MaxBatchDelay time.Duration
	// InitialStartLag is the time a prompt send takes to start, until it has
	// been measured (see startLag). Default 0.
	InitialStartLag time.Duration
	Logger          *slog.Logger
}

// tenantRecord is the durable state of a tenant.
type tenantRecord struct {
	// TAT is in tenant time (see leaky.Pause), like every slot.
	TAT           time.Time   `json:"tat"`
	Pause         leaky.Pause `json:"pause,omitzero"`
	LastAttemptAt time.Time   `json:"last_attempt_at"`
	Accepted      int64       `json:"accepted"`
	Rejected      int64       `json:"rejected"`
	Delivered     int64       `json:"delivered"`
	Failed        int64       `json:"failed"`
	Cancelled     int64       `json:"cancelled"`
	Expired       int64       `json:"expired,omitempty"`
	// Recent is each window's bookkeeping (by the window as written): the
	// slots, in tenant time (unix ns), of its last N sends.
	Recent map[string][]int64 `json:"recent,omitempty"`
}

// recent is the bookkeeping of p's windows (empty for a window new to it).
func (r tenantRecord) recent(p leaky.Policy) []leaky.Recent {
	if len(p.Windows) == 0 {
		return nil
	}
	out := make([]leaky.Recent, len(p.Windows))
	for i, w := range p.Windows {
		for _, ns := range r.Recent[w.String()] {
			out[i] = append(out[i], time.Unix(0, ns))
		}
	}
	return out
}

// setRecent stores the bookkeeping of p's windows (and drops windows no
// longer configured).
func (r *tenantRecord) setRecent(p leaky.Policy, recent []leaky.Recent) {
	if len(p.Windows) == 0 {
		r.Recent = nil
		return
	}
	r.Recent = make(map[string][]int64, len(p.Windows))
	for i, w := range p.Windows {
		ns := make([]int64, len(recent[i]))
		for k, t := range recent[i] {
			ns[k] = t.UnixNano()
		}
		r.Recent[w.String()] = ns
	}
}

type tenantMem struct {
	rec      tenantRecord
	depth    int
	inFlight int
	// pending counts Enqueue calls holding this tenant between decision and
	// commit: the tenant must not be evicted meanwhile.
	pending int
	dirty   bool
}

// schedule is the dispatcher's in-memory view of the due index: a min-heap
// of waiting jobs by real dispatch time, with lazy deletion (an entry counts
// only while waiting[id] still holds its time). It is changed only after the
// matching write commits, so it never shows a job that is not durable.
type schedule struct {
	heap     dueHeap
	waiting  map[string]dueEntry            // id -> entry of each waiting job not held by the dispatcher
	byTenant map[string]map[string]struct{} // tenant -> ids in waiting: to retime a tenant's jobs when it pauses
	expiry   dueHeap                        // waiting jobs with a deadline, by deadline (at = deadline)
}

type dueEntry struct {
	at       time.Time // real time: slot plus the tenant's pauses
	slot     time.Time // tenant time
	id       string
	tenant   string
	deadline time.Time // zero: none
	cost     int
	held     bool // handed over later than its time, for a downstream's ceiling
}

// entryOf is a waiting job's schedule entry at real time at.
func entryOf(j Job, at time.Time) dueEntry {
	return dueEntry{at: at, slot: j.slot(), id: j.ID, tenant: j.Tenant, deadline: j.Deadline, cost: j.cost()}
}

// never is the heap time of a held tenant's jobs: not due until resumed.
var never = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// realAt is when a job of slot goes under pause (never while held).
func realAt(p leaky.Pause, slot time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	return never
}

// dispatchAt is what to tell people of a job's dispatch time: for a held
// tenant, the time it would have if resumed now.
func dispatchAt(p leaky.Pause, slot, now time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	at, _ := p.Resume(now).Real(slot)
	return at
}

type dueHeap []dueEntry

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].id < h[j].id
	}
	return h[i].at.Before(h[j].at)
}
func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)   { *h = append(*h, x.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (sc *schedule) add(e dueEntry) {
	sc.waiting[e.id] = e
	ids := sc.byTenant[e.tenant]
	if ids == nil {
		ids = map[string]struct{}{}
		sc.byTenant[e.tenant] = ids
	}
	ids[e.id] = struct{}{}
	heap.Push(&sc.heap, e)
	if !e.deadline.IsZero() {
		heap.Push(&sc.expiry, dueEntry{at: e.deadline, id: e.id})
	}
	sc.maybeCompact()
}

func (sc *schedule) maybeCompact() {
	if len(sc.heap)+len(sc.expiry) > 4*len(sc.waiting)+1024 {
		sc.compact()
	}
}

// compact rebuilds the heaps from the waiting jobs: stale entries (a hold
// retimes a tenant's jobs to never; finished jobs leave their deadline)
// would otherwise stay until they reach the top. Entries a fair queue holds
// may come out twice; the second is stale by then and skipped.
func (sc *schedule) compact() {
	sc.heap, sc.expiry = sc.heap[:0], sc.expiry[:0]
	for _, e := range sc.waiting {
		sc.heap = append(sc.heap, e)
		if !e.deadline.IsZero() {
			sc.expiry = append(sc.expiry, dueEntry{at: e.deadline, id: e.id})
		}
	}
	heap.Init(&sc.heap)
	heap.Init(&sc.expiry)
}

// readd puts a job back in the schedule at its time under the tenant's
// current pause (which may have changed while it was out).
func (s *BoltStore) readd(e dueEntry) {
	if tm, ok := s.tenants[e.tenant]; ok {
		e.at = realAt(tm.rec.Pause, e.slot)
	}
	s.sched.add(e)
}

// expiring takes out the waiting jobs whose deadline is at or before now
// and whose time is after it: they can no longer be sent in time.
func (sc *schedule) expiring(now time.Time) []dueEntry {
	var out []dueEntry
	for sc.expiry.Len() > 0 && !sc.expiry[0].at.After(now) {
		x := heap.Pop(&sc.expiry).(dueEntry)
		if e, ok := sc.waiting[x.id]; ok && e.at.After(e.deadline) {
			sc.remove(e.id)
			out = append(out, e)
		}
	}
	return out
}

// nextExpiry is the earliest deadline of a waiting job (zero if none).
func (sc *schedule) nextExpiry() time.Time {
	for sc.expiry.Len() > 0 {
		if _, ok := sc.waiting[sc.expiry[0].id]; ok {
			return sc.expiry[0].at
		}
		heap.Pop(&sc.expiry)
	}
	return time.Time{}
}

// remove takes a job out of the schedule (its heap entry goes stale).
func (sc *schedule) remove(id string) (dueEntry, bool) {
	e, ok := sc.waiting[id]
	if !ok {
		return e, false
	}
	delete(sc.waiting, id)
	if ids := sc.byTenant[e.tenant]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(sc.byTenant, e.tenant)
		}
	}
	return e, true
}

// retime moves a tenant's waiting jobs to their real times under p: O(jobs
// waiting in memory), nothing written.
func (sc *schedule) retime(tenant string, p leaky.Pause) {
	for id := range sc.byTenant[tenant] {
		e := sc.waiting[id]
		if at := realAt(p, e.slot); !at.Equal(e.at) {
			e.at = at
			sc.waiting[id] = e
			heap.Push(&sc.heap, e)
		}
	}
	sc.maybeCompact()
}

// peek drops stale entries and returns the earliest waiting one.
func (sc *schedule) peek() (dueEntry, bool) {
	for sc.heap.Len() > 0 {
		e := sc.heap[0]
		if w, ok := sc.waiting[e.id]; ok && w.at.Equal(e.at) {
			return e, true
		}
		heap.Pop(&sc.heap)
	}
	return dueEntry{}, false
}

// BoltStore is the embedded backend: one process, one bbolt file. Decisions
// are made in memory under one lock and made durable by group commit
// (bbolt's Batch) before Enqueue returns.
type BoltStore struct {
	db        *bolt.DB
	clock     clock.Clock
	policy    PolicyFunc
	ceiling   CeilingFunc
	onExpired func(Job)
	retention time.Duration
	log       *slog.Logger

	mu       sync.Mutex
	tenants  map[string]*tenantMem
	idemWait map[string]chan struct{} // keys being admitted right now
	sched    schedule
	claims   map[string]Job        // jobs handed to the dispatcher, as handed over
	fair     map[string]*fairQueue // by downstream: due jobs sharing its ceiling
	// cleanStart: the last stop was clean. After a crash a ceiling starts
	// one interval late: a send just before the crash may have used it.
	cleanStart  bool
	fairStarted map[string]bool

	finishQ   chan finishReq
	wake      chan struct{}
	nextWake  atomic.Int64 // unix ns the dispatcher plans to wake at
	promptLag atomic.Int64 // ns: moving average of a prompt job's start
	stop      chan struct{}
	maintWG   sync.WaitGroup
	closeErr  error
	closed    sync.Once
}

var _ Store = (*BoltStore)(nil)

// OpenBolt opens (creating if needed) the store at path. After a crash,
// jobs whose slot has passed may have been sent just before it: they are
// sent again (same Idempotency-Key), spaced from the last moment one of
// them could have gone, so a restart never sends a burst.
func OpenBolt(path string, opts BoltOptions) (*BoltStore, error) {
	if opts.Policy == nil {
		return nil, errors.New("queue: BoltOptions.Policy is required")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("embedded store: create directory for %s: %w", path, err)
	}
	// The freelist is rebuilt at open instead of written at every commit:
	// commits are what this store does most.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("embedded store %s is locked by another process: stop the other throttler or use another store.path", path)
		}
		return nil, fmt.Errorf("embedded store %s: %w", path, err)
	}
	db.MaxBatchDelay = cmp.Or(opts.MaxBatchDelay, time.Millisecond)
	s := &BoltStore{
		db:        db,
		clock:     cmp.Or[clock.Clock](opts.Clock, clock.Real{}),
		policy:    opts.Policy,
		ceiling:   opts.Ceiling,
		onExpired: opts.OnExpired,
		fair:      map[string]*fairQueue{},

		fairStarted: map[string]bool{},
		retention:   cmp.Or(opts.Retention, 72*time.Hour),
		log:         cmp.Or(opts.Logger, slog.Default()),
		tenants:     map[string]*tenantMem{},
		idemWait:    map[string]chan struct{}{},
		claims:      map[string]Job{},
		sched:       schedule{waiting: map[string]dueEntry{}, byTenant: map[string]map[string]struct{}{}},
		wake:        make(chan struct{}, 1),
		finishQ:     make(chan finishReq),
		stop:        make(chan struct{}),
	}
	if s.ceiling == nil {
		s.ceiling = noCeiling
	}
	s.promptLag.Store(int64(opts.InitialStartLag))
	if err := s.recover(); err != nil {
		db.Close()
		return nil, fmt.Errorf("embedded store %s: recover: %w", path, err)
	}
	s.maintWG.Add(2)
	go s.maintain()
	go s.finisher()
	return s, nil
}

func noCeiling(string) (string, *leaky.Policy) { return "", nil }

func dueKey(at time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(at.UnixNano()))
	return append(k, id...)
}

func parseDueKey(k []byte) (time.Time, string) {
	return time.Unix(0, int64(binary.BigEndian.Uint64(k[:8]))), string(k[8:])
}

// failedKey orders a tenant's failed jobs newest first.
func failedKey(j Job) []byte {
	k := append([]byte(j.Tenant), 0, 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint64(k[len(j.Tenant)+1:], math.MaxUint64-uint64(j.FinishedAt.UnixNano()))
	return append(k, j.ID...)
}

func idemKey(tenant, key string) []byte {
	return append(append([]byte(tenant), 0), key...)
}

func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	raw := b.Get(key)
	if raw == nil {
		return false, nil
	}
	return true, json.Unmarshal(raw, v)
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

// putJob writes a job's record (its payload is stored apart, once).
func putJob(tx *bolt.Tx, j Job) error {
	j.Payload = nil
	return putJSON(tx.Bucket(bucketJobs), []byte(j.ID), j)
}

// getJob reads a job's record, with its payload if withPayload.
func getJob(tx *bolt.Tx, id string, withPayload bool) (Job, bool, error) {
	var j Job
	found, err := getJSON(tx.Bucket(bucketJobs), []byte(id), &j)
	if err != nil || !found {
		return j, found, err
	}
	if withPayload {
		j.Payload = slices.Clone(tx.Bucket(bucketPayloads).Get([]byte(id)))
	}
	return j, true, nil
}

func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *BoltStore) recover() error {
	now := s.clock.Now()
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketJobs, bucketPayloads, bucketDue, bucketDone, bucketFailed, bucketIdem, bucketTenants, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		clean := bytes.Equal(meta.Get(keyClean), []byte("1"))
		s.cleanStart = clean
		if err := meta.Delete(keyClean); err != nil {
			return err
		}
		return s.respace(tx, now, clean)
	})
}

// respace counts waiting jobs per tenant and, for a tenant whose jobs' times
// passed while the process was down, moves them: from the later of now and
// the last moment a send may have happened, plus one interval, one interval
// apart, in their original order. After an unclean stop, any job whose time
// passed may have been sent at that time.
func (s *BoltStore) respace(tx *bolt.Tx, now time.Time, clean bool) error {
	type waiting struct {
		key    []byte
		slot   time.Time
		id     string
		moved  bool
		tenant string
		job    Job
	}
	due := tx.Bucket(bucketDue)
	byTenant := map[string][]*waiting{} // in slot order, as the index is
	var tenants []string
	c := due.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		slot, id := parseDueKey(k)
		name := string(v)
		if _, ok := byTenant[name]; !ok {
			tenants = append(tenants, name)
		}
		j, ok, err := getJob(tx, id, false)
		if err != nil || !ok {
			return fmt.Errorf("job %s in the due index but not stored (%v)", id, err)
		}
		byTenant[name] = append(byTenant[name], &waiting{key: slices.Clone(k), slot: slot, id: id, tenant: name, job: j})
	}
	moved := 0
	for _, name := range tenants {
		jobs := byTenant[name]
		tm, err := s.loadTenantTx(tx, name)
		if err != nil {
			return err
		}
		tm.depth += len(jobs)
		pz := tm.rec.Pause
		if !pz.Held.IsZero() {
			continue // held: nothing goes until an operator resumes it
		}
		p := s.policy(name)
		floor := now
		if !tm.rec.LastAttemptAt.IsZero() {
			floor = later(floor, tm.rec.LastAttemptAt.Add(p.Interval))
		}
		if at, _ := pz.Real(jobs[0].slot); !at.After(now) && !clean {
			// One of them may have been written at any moment before the
			// crash (its time, or later: a slow connection, a held gate):
			// only "before now" is sure.
			floor = later(floor, now.Add(p.Interval))
		}
		recent := tm.rec.recent(p)
		for _, w := range jobs {
			if at, _ := pz.Real(w.slot); !at.Before(floor) {
				break // on schedule: so are the later ones
			}
			// Real(floor - Shift) is floor: floor is past the pause's end.
			// The old slot stays in the windows' bookkeeping: it may have
			// been sent.
			cost := w.job.cost()
			w.slot, w.moved = leaky.WindowSlot(recent, p, floor.Add(-pz.Shift), cost), true
			recent = leaky.Record(recent, p, w.slot, cost)
			floor = w.slot.Add(pz.Shift).Add(time.Duration(cost) * p.Interval)
			if next := w.slot.Add(time.Duration(cost) * p.Interval); tm.rec.TAT.Before(next) {
				tm.rec.TAT = next
			}
			moved++
		}
		tm.rec.setRecent(p, recent)
	}
	for _, name := range tenants {
		pz := s.tenants[name].rec.Pause
		for _, w := range byTenant[name] {
			j := w.job
			if w.moved {
				j.Slot, j.DispatchAt = w.slot, dispatchAt(pz, w.slot, now)
				if err := putJob(tx, j); err != nil {
					return err
				}
				if err := due.Delete(w.key); err != nil {
					return err
				}
				if err := due.Put(dueKey(w.slot, w.id), []byte(name)); err != nil {
					return err
				}
			}
			s.sched.add(entryOf(j, realAt(pz, w.slot)))
		}
	}
	for name, tm := range s.tenants {
		if err := putJSON(tx.Bucket(bucketTenants), []byte(name), tm.rec); err != nil {
			return err
		}
	}
	if moved > 0 {
		s.log.Info("spaced out jobs whose time passed while stopped", "jobs", moved, "clean_stop", clean)
	}
	return nil
}

// loadTenantTx returns the in-memory tenant, reading it from tx if needed.
// Callers hold s.mu or run before the store is shared.
func (s *BoltStore) loadTenantTx(tx *bolt.Tx, name string) (*tenantMem, error) {
	if tm, ok := s.tenants[name]; ok {
		return tm, nil
	}
	tm := &tenantMem{}
	if _, err := getJSON(tx.Bucket(bucketTenants), []byte(name), &tm.rec); err != nil {
		return nil, err
	}
	// The next send may not come sooner than one interval after the last
	// recorded one, even if the schedule says so (a retry sent long after its
	// reserved slot, a late write): in a running process the gate knows,
	// after a restart or an eviction only this does.
	if !tm.rec.LastAttemptAt.IsZero() {
		p := s.policy(name)
		// In tenant time: its real time is LastAttemptAt + Interval.
		if floor := tm.rec.LastAttemptAt.Add(p.Interval + p.Tolerance() - tm.rec.Pause.Shift); tm.rec.TAT.Before(floor) {
			tm.rec.TAT = floor
		}
	}
	s.tenants[name] = tm
	return tm, nil
}

// loadTenant is loadTenantTx in its own read transaction (s.mu held).
func (s *BoltStore) loadTenant(name string) (*tenantMem, error) {
	if tm, ok := s.tenants[name]; ok {
		return tm, nil
	}
	var tm *tenantMem
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		tm, err = s.loadTenantTx(tx, name)
		return err
	})
	return tm, unavailable(err)
}

// putTenant writes the tenant's current in-memory record.
func (s *BoltStore) putTenant(tx *bolt.Tx, name string) error {
	s.mu.Lock()
	tm, ok := s.tenants[name]
	var rec tenantRecord
	if ok {
		rec = tm.rec
	}
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return putJSON(tx.Bucket(bucketTenants), []byte(name), rec)
}

// Enqueue implements Store.
func (s *BoltStore) Enqueue(ctx context.Context, tenant string, newJobs []NewJob) ([]Admission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	policy := s.policy(tenant)
	out := make([]Admission, len(newJobs))
	var admitted []Job
	var claimedKeys []string

	s.mu.Lock()
	tm, err := s.waitKeysAndLoad(tenant, newJobs)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	now := s.clock.Now()
	pz := tm.rec.Pause
	paused, _ := pz.Paused(now)
	// Decide as if the job arrived when it can first be sent: a job sent at
	// once is late by the time a send takes to start (the commit, the
	// hand-over, the connection), and every job queued behind it inherits
	// that lateness. Scheduling from there keeps the promises true. All in
	// tenant time: a paused tenant's clock stands still.
	arrival := pz.TenantTime(now).Add(s.startLag())
	_, ceiling := s.ceiling(tenant)
	most := policy.MaxCost() // the largest cost that can ever be admitted
	if ceiling != nil {
		for _, w := range ceiling.Windows { // a ceiling spaces, it never refuses: only its windows bound a cost
			most = min(most, w.N)
		}
	}
	inCall := map[string]int{} // idempotency key -> index of its first use in this call
	for i, nj := range newJobs {
		if nj.IdempotencyKey != "" {
			if first, ok := inCall[nj.IdempotencyKey]; ok {
				out[i] = out[first]
				out[i].Duplicate = out[first].Admitted()
				continue
			}
			inCall[nj.IdempotencyKey] = i
			prev, found, err := s.jobByKey(tenant, nj.IdempotencyKey)
			if err != nil {
				// Nothing of this call is admitted (the slots taken so far
				// stay taken: a gap is safe).
				tm.depth -= len(admitted)
				tm.rec.Accepted -= int64(len(admitted))
				s.releaseKeys(claimedKeys)
				s.mu.Unlock()
				return nil, err
			}
			if found {
				out[i] = Admission{Job: prev, Duplicate: true, ExpectedDelay: prev.AdmitDelay, QueueDepth: prev.AdmitDepth, Capacity: policy.Capacity}
				continue
			}
		}
		cost := max(nj.Cost, 1)
		if cost > most {
			out[i] = Admission{Impossible: &ImpossibleError{Tenant: tenant, Reason: ReasonCostTooLarge, Cost: cost, MaxCost: most}, QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		d, st, recent := admit(tm.rec, tm.depth, arrival, now, policy, cost)
		if !d.Admitted {
			tm.rec.Rejected++
			tm.dirty = true
			out[i] = Admission{Rejected: rejection(tenant, policy, d, tm.depth), QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		at := dispatchAt(pz, d.Slot, now)
		delay := max(at.Sub(now), ceilingDelay(ceiling, tm.depth))
		if !nj.Deadline.IsZero() && now.Add(delay).After(nj.Deadline) {
			// Worthless by the time it would go: say so now, take nothing.
			out[i] = Admission{Impossible: &ImpossibleError{Tenant: tenant, Reason: ReasonWouldExpire, ExpectedDelay: delay, Deadline: nj.Deadline}, QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		tm.rec.TAT = st.TAT
		tm.rec.setRecent(policy, recent)
		tm.rec.Accepted++
		tm.depth++
		j := Job{
			ID: newID(now), Tenant: tenant, State: StateQueued, Payload: nj.Payload,
			IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: now, DispatchAt: at, Slot: d.Slot,
			AdmitDelay: delay, AdmitDepth: tm.depth, Prompt: d.Delay == 0 && !paused,
			Deadline: nj.Deadline,
		}
		if cost > 1 {
			j.Cost = cost
		}
		admitted = append(admitted, j)
		out[i] = Admission{Job: j, ExpectedDelay: j.AdmitDelay, QueueDepth: tm.depth, Capacity: policy.Capacity}
		if nj.IdempotencyKey != "" {
			k := string(idemKey(tenant, nj.IdempotencyKey))
			s.idemWait[k] = make(chan struct{})
			claimedKeys = append(claimedKeys, k)
		}
	}
	if len(admitted) > 0 {
		tm.pending++
	}
	s.mu.Unlock()

	if len(admitted) == 0 {
		return out, nil
	}
	err = s.db.Batch(func(tx *bolt.Tx) error {
		payloads, due, idem := tx.Bucket(bucketPayloads), tx.Bucket(bucketDue), tx.Bucket(bucketIdem)
		for _, j := range admitted {
			if err := putJob(tx, j); err != nil {
				return err
			}
			if err := payloads.Put([]byte(j.ID), j.Payload); err != nil {
				return err
			}
			if err := due.Put(dueKey(j.Slot, j.ID), []byte(tenant)); err != nil {
				return err
			}
			if j.IdempotencyKey != "" {
				if err := idem.Put(idemKey(tenant, j.IdempotencyKey), []byte(j.ID)); err != nil {
					return err
				}
			}
		}
		return s.putTenant(tx, tenant)
	})

	s.mu.Lock()
	tm.pending--
	if err != nil {
		// Nothing was admitted after all. The slots stay taken: a gap in the
		// schedule is safe, a second job in one slot is not.
		tm.depth -= len(admitted)
		tm.rec.Accepted -= int64(len(admitted))
		tm.dirty = true
	}
	var soonest time.Time
	if err == nil {
		// The tenant's pause may have changed since the decision: schedule
		// by the current one.
		for _, j := range admitted {
			e := entryOf(j, realAt(tm.rec.Pause, j.Slot))
			s.sched.add(e)
			if soonest.IsZero() || e.at.Before(soonest) {
				soonest = e.at
			}
		}
	}
	s.releaseKeys(claimedKeys)
	s.mu.Unlock()
	if err != nil {
		return nil, unavailable(err)
	}
	s.pokeIfSooner(soonest)
	return out, nil
}

// admit decides one job of cost in the tenant's time (leaky.Decide: the
// rate and every window), with a refusal's Retry-After in real time (it
// includes what is left of a pause). It also refuses a job when depth jobs
// already wait and the bucket could not hold one more. The schedule alone
// would admit one too many while the tenant is paused (the job at the
// frozen "now" looks as if it goes at once, but it waits), and past
// capacity when sends are slower than the tenant's rate (a downstream's
// ceiling shared with others).
func admit(rec tenantRecord, depth int, arrival, now time.Time, p leaky.Policy, cost int) (leaky.Decision, leaky.State, []leaky.Recent) {
	d, st, recent := leaky.Decide(leaky.State{TAT: rec.TAT}, rec.recent(p), arrival, p, cost, depth)
	room := p.Capacity + p.Burst // waiting, and going at once
	if paused, _ := rec.Pause.Paused(now); paused {
		room = p.Capacity // nothing goes at once: all of them wait
	}
	if d.Admitted && depth >= room {
		d, st = leaky.Decision{RetryAfter: p.Interval}, leaky.State{TAT: rec.TAT}
	}
	if !d.Admitted {
		tnow := rec.Pause.TenantTime(now)
		d.RetryAfter = dispatchAt(rec.Pause, tnow.Add(d.RetryAfter), now).Sub(now)
	}
	return d, st, recent
}

// reserve takes a slot for another attempt of a job of cost, at or after
// tenant time from and no earlier than notBefore (a backoff), paced like any
// job and within every window; it does not refuse (the job was admitted).
func (r *tenantRecord) reserve(p leaky.Policy, from, notBefore time.Time, cost int) time.Time {
	slot, st := leaky.ReserveCost(leaky.State{TAT: r.TAT}, from, p, cost)
	at := later(slot, notBefore)
	if len(p.Windows) > 0 {
		at = leaky.WindowSlot(r.recent(p), p, at, cost)
		r.record(p, at, cost)
		if !notBefore.After(slot) {
			st = leaky.Push(st, at, p, cost) // a window moved it: the rest follow
		}
	}
	r.TAT = st.TAT
	return at
}

// record counts a send of cost at slot in the tenant's windows.
func (r *tenantRecord) record(p leaky.Policy, slot time.Time, cost int) {
	if len(p.Windows) == 0 {
		return
	}
	r.setRecent(p, leaky.Record(r.recent(p), p, slot, cost))
}

// waitKeysAndLoad waits (s.mu held, released while waiting) until none of
// the call's idempotency keys is being admitted by another call, then
// returns the tenant loaded.
func (s *BoltStore) waitKeysAndLoad(tenant string, jobs []NewJob) (*tenantMem, error) {
	for {
		var busy chan struct{}
		for _, j := range jobs {
			if j.IdempotencyKey == "" {
				continue
			}
			if ch, ok := s.idemWait[string(idemKey(tenant, j.IdempotencyKey))]; ok {
				busy = ch
				break
			}
		}
		if busy == nil {
			return s.loadTenant(tenant)
		}
		s.mu.Unlock()
		<-busy
		s.mu.Lock()
	}
}

func (s *BoltStore) releaseKeys(keys []string) {
	for _, k := range keys {
		close(s.idemWait[k])
		delete(s.idemWait, k)
	}
}

func (s *BoltStore) jobByKey(tenant, key string) (Job, bool, error) {
	var j Job
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bucketIdem).Get(idemKey(tenant, key))
		if id == nil {
			return nil
		}
		var err error
		j, found, err = getJob(tx, string(id), false)
		return err
	})
	if c, ok := s.claims[j.ID]; found && ok {
		j.State, j.Attempts = StateDispatching, c.Attempts
	}
	return j, found, unavailable(err)
}

// ceilingDelay is the least a tenant's next job waits for its downstream's
// ceiling with ahead of its jobs before it: as if it had the ceiling to
// itself (sharing it with others who are due makes it longer).
func ceilingDelay(c *leaky.Policy, ahead int) time.Duration {
	if c == nil || ahead <= 0 {
		return 0
	}
	return time.Duration(max(0, ahead+1-c.Burst)) * c.Interval
}

// maxStartLag caps how far the measured start of a send moves schedules.
const maxStartLag = 100 * time.Millisecond

// startLag is how long a job sent at once takes to reach the downstream,
// measured (a moving average over prompt first attempts).
func (s *BoltStore) startLag() time.Duration {
	return min(time.Duration(s.promptLag.Load()), maxStartLag)
}

// observeStart feeds the moving average with one prompt first attempt.
func (s *BoltStore) observeStart(j Job) {
	if !j.Prompt || j.Attempts != 1 || j.SentAt.IsZero() {
		return
	}
	sample := max(0, j.SentAt.Sub(j.EnqueuedAt))
	for {
		old := s.promptLag.Load()
		next := old + (int64(sample)-old)/8
		if s.promptLag.CompareAndSwap(old, next) {
			return
		}
	}
}

// Tenant implements Store.
func (s *BoltStore) Tenant(ctx context.Context, name string) (TenantStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tm, err := s.loadTenant(name)
	if err != nil {
		return TenantStatus{}, err
	}
	return s.status(name, tm, s.clock.Now()), nil
}

func (s *BoltStore) status(name string, tm *tenantMem, now time.Time) TenantStatus {
	_, ceiling := s.ceiling(name)
	pz := tm.rec.Pause
	tnow := pz.TenantTime(now)
	p := s.policy(name)
	slot := tnow.Add(leaky.ExpectedDelay(leaky.State{TAT: tm.rec.TAT}, tnow, p))
	slot = leaky.WindowSlot(tm.rec.recent(p), p, slot, 1)
	paused, until := pz.Paused(now)
	return TenantStatus{
		Tenant:        name,
		QueueDepth:    tm.depth,
		InFlight:      tm.inFlight,
		ExpectedDelay: max(dispatchAt(pz, slot, now).Sub(now), ceilingDelay(ceiling, tm.depth)),
		Expired:       tm.rec.Expired,
		Paused:        paused,
		PausedUntil:   until,
		Held:          !pz.Held.IsZero(),
		Accepted:      tm.rec.Accepted,
		Rejected:      tm.rec.Rejected,
		Delivered:     tm.rec.Delivered,
		Failed:        tm.rec.Failed,
		Cancelled:     tm.rec.Cancelled,
	}
}

// Tenants implements Store.
func (s *BoltStore) Tenants(ctx context.Context, offset, limit int) ([]TenantStatus, error) {
	now := s.clock.Now()
	s.mu.Lock()
	var all []TenantStatus
	for name, tm := range s.tenants {
		if tm.depth > 0 || tm.inFlight > 0 {
			all = append(all, s.status(name, tm, now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b TenantStatus) int {
		return cmp.Or(cmp.Compare(b.QueueDepth, a.QueueDepth), cmp.Compare(b.InFlight, a.InFlight), cmp.Compare(a.Tenant, b.Tenant))
	})
	if offset >= len(all) {
		return nil, nil
	}
	all = all[offset:]
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// Ping implements Store.
func (s *BoltStore) Ping(ctx context.Context) error {
	return unavailable(s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs) == nil {
			return errors.New("jobs bucket missing")
		}
		return nil
	}))
}

// Close stops maintenance and closes the file. Call it after Consume returned.
func (s *BoltStore) Close() error {
	s.closed.Do(func() {
		close(s.stop)
		s.maintWG.Wait()
		s.closeErr = s.flushDirty()
		if s.closeErr == nil {
			s.closeErr = s.markClean()
		}
		if err := s.db.Close(); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// markClean records a clean stop: no job is being sent, so none whose slot
// passed was sent without its outcome being recorded.
func (s *BoltStore) markClean() error {
	s.mu.Lock()
	active := len(s.claims)
	s.mu.Unlock()
	if active > 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyClean, []byte("1"))
	})
}

// maintain removes finished jobs past retention and forgets idle tenants.
func (s *BoltStore) maintain() {
	defer s.maintWG.Done()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		if err := s.flushDirty(); err != nil {
			s.log.Error("cannot save tenant counters", "err", err)
		}
		s.evictIdle()
		if n, err := s.reap(s.clock.Now().Add(-s.retention), 1000); err != nil {
			s.log.Error("cannot remove old finished jobs", "err", err)
		} else if n > 0 {
			s.log.Debug("removed finished jobs past retention", "jobs", n)
		}
	}
}

func (s *BoltStore) flushDirty() error {
	// Clean before writing: a change made meanwhile marks the tenant dirty
	// again and is written next time; a failed write marks them all again.
	s.mu.Lock()
	var names []string
	for name, tm := range s.tenants {
		if tm.dirty {
			names = append(names, name)
			tm.dirty = false
		}
	}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, n := range names {
			if err := s.putTenant(tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.mu.Lock()
		for _, n := range names {
			if tm, ok := s.tenants[n]; ok {
				tm.dirty = true
			}
		}
		s.mu.Unlock()
	}
	return err
}

// evictIdle drops tenants whose state no longer matters from memory (their
// record stays on disk): memory grows with active tenants only.
func (s *BoltStore) evictIdle() {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, tm := range s.tenants {
		paused, _ := tm.rec.Pause.Paused(now)
		if tm.depth == 0 && tm.inFlight == 0 && tm.pending == 0 && !tm.dirty && !paused && leaky.Idle(leaky.State{TAT: tm.rec.TAT}, tm.rec.Pause.TenantTime(now)) {
			delete(s.tenants, name)
		}
	}
}

// reap deletes up to limit finished jobs that finished before cutoff, with
// their idempotency keys.
func (s *BoltStore) reap(cutoff time.Time, limit int) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		jobs, done, idem := tx.Bucket(bucketJobs), tx.Bucket(bucketDone), tx.Bucket(bucketIdem)
		c := done.Cursor()
		for k, _ := c.First(); k != nil && n < limit; k, _ = c.First() {
			at, id := parseDueKey(k)
			if !at.Before(cutoff) {
				break
			}
			if j, ok, _ := getJob(tx, id, false); ok {
				if j.IdempotencyKey != "" && bytes.Equal(idem.Get(idemKey(j.Tenant, j.IdempotencyKey)), []byte(id)) {
					if err := idem.Delete(idemKey(j.Tenant, j.IdempotencyKey)); err != nil {
						return err
					}
				}
				if j.State == StateFailed {
					if err := tx.Bucket(bucketFailed).Delete(failedKey(j)); err != nil {
						return err
					}
				}
			}
			if err := jobs.Delete([]byte(id)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketPayloads).Delete([]byte(id)); err != nil {
				return err
			}
			if err := done.Delete(k); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}
