package queue

import (
	"bytes"
	"cmp"
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
	bucketJobs    = []byte("jobs")    // id -> Job (JSON)
	bucketDue     = []byte("due")     // dispatch_at (8 bytes, big endian ns) + id -> tenant: waiting jobs
	bucketClaimed = []byte("claimed") // id -> tenant: jobs being sent
	bucketDone    = []byte("done")    // finished_at + id -> nil: for the reaper
	bucketIdem    = []byte("idem")    // tenant + 0x00 + key -> id
	bucketTenants = []byte("tenants") // tenant -> tenantRecord (JSON)
)

// BoltOptions configure the embedded store; zero values take defaults.
type BoltOptions struct {
	Clock  clock.Clock // default clock.Real
	Policy PolicyFunc  // required
	// Retention is how long finished jobs are kept. Default 72h.
	Retention time.Duration
	// MaxBatchDelay is how long a write waits for others to share its
	// fsync. Default 1ms.
	MaxBatchDelay time.Duration
	Logger        *slog.Logger
}

// tenantRecord is the durable state of a tenant.
type tenantRecord struct {
	TAT           time.Time `json:"tat"`
	LastAttemptAt time.Time `json:"last_attempt_at"`
	Accepted      int64     `json:"accepted"`
	Rejected      int64     `json:"rejected"`
	Delivered     int64     `json:"delivered"`
	Failed        int64     `json:"failed"`
	Cancelled     int64     `json:"cancelled"`
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

// BoltStore is the embedded backend: one process, one bbolt file. Decisions
// are made in memory under one lock and made durable by group commit
// (bbolt's Batch) before Enqueue returns.
type BoltStore struct {
	db        *bolt.DB
	clock     clock.Clock
	policy    PolicyFunc
	retention time.Duration
	log       *slog.Logger

	mu       sync.Mutex
	tenants  map[string]*tenantMem
	idemWait map[string]chan struct{} // keys being admitted right now

	wake     chan struct{}
	nextWake atomic.Int64 // unix ns the dispatcher plans to wake at
	stop     chan struct{}
	maintWG  sync.WaitGroup
	closeErr error
	closed   sync.Once
}

var _ Store = (*BoltStore)(nil)

// OpenBolt opens (creating if needed) the store at path and recovers from
// an earlier stop: jobs that were being sent go back to waiting, and jobs
// whose slot passed while the process was down are spaced out again from
// now, so a restart never sends a burst.
func OpenBolt(path string, opts BoltOptions) (*BoltStore, error) {
	if opts.Policy == nil {
		return nil, errors.New("queue: BoltOptions.Policy is required")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("embedded store: create directory for %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
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
		retention: cmp.Or(opts.Retention, 72*time.Hour),
		log:       cmp.Or(opts.Logger, slog.Default()),
		tenants:   map[string]*tenantMem{},
		idemWait:  map[string]chan struct{}{},
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	if err := s.recover(); err != nil {
		db.Close()
		return nil, fmt.Errorf("embedded store %s: recover: %w", path, err)
	}
	s.maintWG.Add(1)
	go s.maintain()
	return s, nil
}

func dueKey(at time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(at.UnixNano()))
	return append(k, id...)
}

func parseDueKey(k []byte) (time.Time, string) {
	return time.Unix(0, int64(binary.BigEndian.Uint64(k[:8]))), string(k[8:])
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

func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// interruptedMargin bounds how long after its slot an attempt that a crash
// cut short may have been written (a late connection, a gate held back by a
// late predecessor).
const interruptedMargin = 50 * time.Millisecond

func (s *BoltStore) recover() error {
	now := s.clock.Now()
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketJobs, bucketDue, bucketClaimed, bucketDone, bucketIdem, bucketTenants} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		jobs, due, claimed := tx.Bucket(bucketJobs), tx.Bucket(bucketDue), tx.Bucket(bucketClaimed)
		// Attempts cut short by the stop: send again (same id, so the same
		// Idempotency-Key); the attempt stays counted.
		var interrupted [][]byte
		if err := claimed.ForEach(func(id, _ []byte) error {
			interrupted = append(interrupted, slices.Clone(id))
			return nil
		}); err != nil {
			return err
		}
		for _, id := range interrupted {
			var j Job
			if ok, err := getJSON(jobs, id, &j); err != nil || !ok {
				_ = claimed.Delete(id)
				continue
			}
			j.State = StateRetrying
			j.LastError = "interrupted: the throttler stopped during this attempt; it is sent again with the same Idempotency-Key"
			// When that attempt was written is not known: its slot, or a
			// little after. Space the next one from a little after.
			s.mu.Lock()
			tm, err := s.loadTenantTx(tx, j.Tenant)
			if err == nil && tm.rec.LastAttemptAt.Before(j.DispatchAt.Add(interruptedMargin)) {
				tm.rec.LastAttemptAt = j.DispatchAt.Add(interruptedMargin)
			}
			s.mu.Unlock()
			if err != nil {
				return err
			}
			if err := putJSON(jobs, id, j); err != nil {
				return err
			}
			if err := due.Put(dueKey(j.DispatchAt, j.ID), []byte(j.Tenant)); err != nil {
				return err
			}
			if err := claimed.Delete(id); err != nil {
				return err
			}
		}
		if len(interrupted) > 0 {
			s.log.Info("recovered interrupted attempts", "jobs", len(interrupted))
		}
		return s.respace(tx, now)
	})
}

// respace counts waiting jobs per tenant and moves the slots that passed
// while the process was down: from max(now, last attempt + T) on, one
// interval apart, in their original order.
func (s *BoltStore) respace(tx *bolt.Tx, now time.Time) error {
	type move struct {
		old []byte
		id  string
		at  time.Time
	}
	jobs, due := tx.Bucket(bucketJobs), tx.Bucket(bucketDue)
	next := map[string]time.Time{} // earliest slot the tenant's next job may have
	var moves []move
	c := due.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		at, id := parseDueKey(k)
		tenant := string(v)
		tm, err := s.loadTenantTx(tx, tenant)
		if err != nil {
			return err
		}
		tm.depth++
		p := s.policy(tenant)
		floor, seen := next[tenant]
		if !seen {
			floor = now
			if !tm.rec.LastAttemptAt.IsZero() {
				floor = later(now, tm.rec.LastAttemptAt.Add(p.Interval))
			}
		}
		if at.Before(floor) {
			moves = append(moves, move{old: slices.Clone(k), id: id, at: floor})
			at = floor
			next[tenant] = at.Add(p.Interval)
			if tm.rec.TAT.Before(next[tenant]) {
				tm.rec.TAT = next[tenant]
			}
			continue
		}
		// On schedule: so are the later jobs of this tenant.
		next[tenant] = time.Time{}
	}
	for _, m := range moves {
		var j Job
		if ok, err := getJSON(jobs, []byte(m.id), &j); err != nil || !ok {
			return fmt.Errorf("job %s in the due index but not stored (%v)", m.id, err)
		}
		j.DispatchAt = m.at
		if err := putJSON(jobs, []byte(m.id), j); err != nil {
			return err
		}
		if err := due.Delete(m.old); err != nil {
			return err
		}
		if err := due.Put(dueKey(m.at, m.id), []byte(j.Tenant)); err != nil {
			return err
		}
	}
	for name, tm := range s.tenants {
		if err := putJSON(tx.Bucket(bucketTenants), []byte(name), tm.rec); err != nil {
			return err
		}
	}
	if len(moves) > 0 {
		s.log.Info("spaced out jobs whose slot passed while stopped", "jobs", len(moves))
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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
	s.tenants[name] = tm
	return tm, nil
}

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
		tm.dirty = false
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
	inCall := map[string]int{} // idempotency key -> index of its first use in this call
	for i, nj := range newJobs {
		if nj.IdempotencyKey != "" {
			if first, ok := inCall[nj.IdempotencyKey]; ok {
				out[i] = out[first]
				out[i].Duplicate = out[first].Rejected == nil
				continue
			}
			inCall[nj.IdempotencyKey] = i
			prev, found, err := s.jobByKey(tenant, nj.IdempotencyKey)
			if err != nil {
				s.releaseKeys(claimedKeys)
				s.mu.Unlock()
				return nil, err
			}
			if found {
				out[i] = Admission{Job: prev, Duplicate: true, ExpectedDelay: prev.AdmitDelay, QueueDepth: prev.AdmitDepth, Capacity: policy.Capacity}
				continue
			}
		}
		d, st := leaky.Admit(leaky.State{TAT: tm.rec.TAT}, now, policy)
		if !d.Admitted {
			tm.rec.Rejected++
			tm.dirty = true
			out[i] = Admission{Rejected: rejection(tenant, policy, d, tm.depth), QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		tm.rec.TAT = st.TAT
		tm.rec.Accepted++
		tm.depth++
		j := Job{
			ID: newID(now), Tenant: tenant, State: StateQueued, Payload: nj.Payload,
			IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: now, DispatchAt: d.Slot,
			AdmitDelay: d.Delay, AdmitDepth: tm.depth,
		}
		admitted = append(admitted, j)
		out[i] = Admission{Job: j, ExpectedDelay: d.Delay, QueueDepth: tm.depth, Capacity: policy.Capacity}
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
		jb, due, idem := tx.Bucket(bucketJobs), tx.Bucket(bucketDue), tx.Bucket(bucketIdem)
		for _, j := range admitted {
			if err := putJSON(jb, []byte(j.ID), j); err != nil {
				return err
			}
			if err := due.Put(dueKey(j.DispatchAt, j.ID), []byte(tenant)); err != nil {
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
	}
	s.releaseKeys(claimedKeys)
	s.mu.Unlock()
	if err != nil {
		return nil, unavailable(err)
	}
	s.pokeIfSooner(admitted[0].DispatchAt)
	return out, nil
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
		found, err = getJSON(tx.Bucket(bucketJobs), id, &j)
		return err
	})
	return j, found, unavailable(err)
}

// claimEvery is the longest a due job waits to be claimed once within the
// lead; it lets one claim transaction take every job due in that time.
const claimEvery = 10 * time.Millisecond

// pokeIfSooner wakes the dispatcher if a job due at slot is due before it
// planned to wake.
func (s *BoltStore) pokeIfSooner(slot time.Time) {
	if slot.Add(-DefaultLead).UnixNano() < s.nextWake.Load() {
		s.poke()
	}
}

// poke wakes the dispatcher.
func (s *BoltStore) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Job implements Store.
func (s *BoltStore) Job(ctx context.Context, id string) (Job, error) {
	if !validID(id) {
		return Job{}, ErrNotFound
	}
	var j Job
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		found, err = getJSON(tx.Bucket(bucketJobs), []byte(id), &j)
		return err
	})
	if err != nil {
		return Job{}, unavailable(err)
	}
	if !found {
		return Job{}, ErrNotFound
	}
	return j, nil
}

// Cancel implements Store.
func (s *BoltStore) Cancel(ctx context.Context, id string) (Job, error) {
	if !validID(id) {
		return Job{}, ErrNotFound
	}
	var j Job
	err := s.db.Update(func(tx *bolt.Tx) error {
		found, err := getJSON(tx.Bucket(bucketJobs), []byte(id), &j)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if !j.State.Waiting() {
			return &StateError{ID: id, State: j.State, Op: "cancel"}
		}
		if err := tx.Bucket(bucketDue).Delete(dueKey(j.DispatchAt, j.ID)); err != nil {
			return err
		}
		j.State = StateCancelled
		j.FinishedAt = s.clock.Now()
		if err := putJSON(tx.Bucket(bucketJobs), []byte(id), j); err != nil {
			return err
		}
		if err := tx.Bucket(bucketDone).Put(dueKey(j.FinishedAt, j.ID), nil); err != nil {
			return err
		}
		s.mu.Lock()
		tm, err := s.loadTenantTx(tx, j.Tenant)
		if err == nil {
			tm.depth--
			tm.rec.Cancelled++
			tm.dirty = true
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		return s.putTenant(tx, j.Tenant)
	})
	var se *StateError
	if errors.Is(err, ErrNotFound) || errors.As(err, &se) {
		return j, err
	}
	if err != nil {
		return Job{}, unavailable(err)
	}
	return j, nil
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
	return TenantStatus{
		Tenant:        name,
		QueueDepth:    tm.depth,
		InFlight:      tm.inFlight,
		ExpectedDelay: leaky.ExpectedDelay(leaky.State{TAT: tm.rec.TAT}, now, s.policy(name)),
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
		if err := s.db.Close(); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// claim marks up to limit jobs due at or before horizon as dispatching (one
// transaction, so one fsync for many jobs) and returns them, with the slot of
// the next waiting job (zero if none).
func (s *BoltStore) claim(horizon time.Time, limit int) ([]Job, time.Time, error) {
	// Look first without writing: a write transaction costs an fsync.
	var first time.Time
	if err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketDue).Cursor().First(); k != nil {
			first, _ = parseDueKey(k)
		}
		return nil
	}); err != nil {
		return nil, time.Time{}, unavailable(err)
	}
	if first.IsZero() || first.After(horizon) {
		return nil, first, nil
	}
	var claimed []Job
	var next time.Time
	err := s.db.Update(func(tx *bolt.Tx) error {
		claimed, next = claimed[:0], time.Time{}
		jobs, due, cl := tx.Bucket(bucketJobs), tx.Bucket(bucketDue), tx.Bucket(bucketClaimed)
		c := due.Cursor()
		var keys [][]byte
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			at, id := parseDueKey(k)
			if at.After(horizon) || len(claimed) == limit {
				next = at
				break
			}
			var j Job
			if ok, err := getJSON(jobs, []byte(id), &j); err != nil || !ok {
				return fmt.Errorf("job %s in the due index but not stored (%v)", id, err)
			}
			j.State = StateDispatching
			j.Attempts++
			claimed = append(claimed, j)
			keys = append(keys, slices.Clone(k))
		}
		touched := map[string]bool{}
		s.mu.Lock()
		for _, j := range claimed {
			if tm, ok := s.tenants[j.Tenant]; ok && tm.rec.LastAttemptAt.Before(j.DispatchAt) {
				tm.rec.LastAttemptAt = j.DispatchAt
			}
			touched[j.Tenant] = true
		}
		s.mu.Unlock()
		for i, j := range claimed {
			if err := due.Delete(keys[i]); err != nil {
				return err
			}
			if err := putJSON(jobs, []byte(j.ID), j); err != nil {
				return err
			}
			if err := cl.Put([]byte(j.ID), []byte(j.Tenant)); err != nil {
				return err
			}
		}
		for name := range touched {
			if err := s.putTenant(tx, name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, unavailable(err)
	}
	s.mu.Lock()
	for _, j := range claimed {
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.depth--
			tm.inFlight++
		}
	}
	s.mu.Unlock()
	return claimed, next, nil
}

// finish records the outcome of one claimed job.
func (s *BoltStore) finish(j Job, o Outcome) error {
	now := s.clock.Now()
	policy := s.policy(j.Tenant)
	var result Job
	err := s.db.Batch(func(tx *bolt.Tx) error {
		jobs := tx.Bucket(bucketJobs)
		var cur Job
		if ok, err := getJSON(jobs, []byte(j.ID), &cur); err != nil || !ok {
			return fmt.Errorf("claimed job %s not stored (%v)", j.ID, err)
		}
		cur.ResponseStatus = cmp.Or(o.Status, cur.ResponseStatus)
		if !o.SentAt.IsZero() {
			cur.SentAt = o.SentAt
		}
		cur.LastError = cmp.Or(o.Error, cur.LastError)
		s.mu.Lock()
		tm, err := s.loadTenantTx(tx, j.Tenant)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		if o.SentAt.After(tm.rec.LastAttemptAt) {
			tm.rec.LastAttemptAt = o.SentAt
		}
		switch o.Result {
		case Succeeded, Failed:
			cur.State = StateSucceeded
			if o.Result == Failed {
				cur.State = StateFailed
			} else {
				cur.LastError = ""
			}
			cur.FinishedAt = now
		case Retry:
			cur.State = StateRetrying
			slot, st := leaky.Reserve(leaky.State{TAT: tm.rec.TAT}, later(now, o.NotBefore), policy)
			tm.rec.TAT = st.TAT
			cur.DispatchAt = slot
		default: // Released: nothing was sent
			cur.Attempts--
			cur.State = StateQueued
			if cur.Attempts > 0 {
				cur.State = StateRetrying
			}
		}
		s.mu.Unlock()
		if err := putJSON(jobs, []byte(j.ID), cur); err != nil {
			return err
		}
		if err := tx.Bucket(bucketClaimed).Delete([]byte(j.ID)); err != nil {
			return err
		}
		if cur.State.Finished() {
			if err := tx.Bucket(bucketDone).Put(dueKey(cur.FinishedAt, cur.ID), nil); err != nil {
				return err
			}
		} else if err := tx.Bucket(bucketDue).Put(dueKey(cur.DispatchAt, cur.ID), []byte(cur.Tenant)); err != nil {
			return err
		}
		result = cur
		return s.putTenant(tx, j.Tenant)
	})
	if err != nil {
		return unavailable(err)
	}
	s.mu.Lock()
	if tm, ok := s.tenants[j.Tenant]; ok {
		tm.inFlight--
		switch result.State {
		case StateSucceeded:
			tm.rec.Delivered++
		case StateFailed:
			tm.rec.Failed++
		default:
			tm.depth++
		}
		tm.dirty = true
	}
	s.mu.Unlock()
	if !result.State.Finished() {
		s.pokeIfSooner(result.DispatchAt)
	}
	return nil
}

// Consume implements Store.
func (s *BoltStore) Consume(ctx context.Context, h Handler, opts ConsumeOptions) error {
	lead := cmp.Or(opts.Lead, DefaultLead)
	sem := make(chan struct{}, cmp.Or(opts.Concurrency, 1024))
	freed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if ctx.Err() != nil {
			return nil
		}
		// While awake, every enqueue pokes (the poke waits in the channel);
		// once asleep, only those due before the planned wake do.
		s.nextWake.Store(math.MaxInt64)
		now := s.clock.Now()
		var next time.Time
		if free := cap(sem) - len(sem); free > 0 {
			jobs, n, err := s.claim(now.Add(lead), free)
			if err != nil {
				s.log.Error("dispatcher cannot claim due jobs; trying again", "err", err)
				n = now.Add(time.Second)
			}
			next = n
			for _, j := range jobs {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.runHandler(ctx, h, j)
					<-sem
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
		}
		// Sleep until the next job is well within the lead (so one claim,
		// one fsync, takes many jobs), something is enqueued that is due
		// sooner, a handler frees a place, or the poll interval passes.
		wait := time.Second
		if !next.IsZero() && len(sem) < cap(sem) {
			wait = min(wait, next.Add(-lead+claimEvery).Sub(now))
		}
		s.nextWake.Store(now.Add(wait).UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-freed:
		case <-s.clock.After(max(wait, time.Millisecond)):
		}
	}
}

func (s *BoltStore) runHandler(ctx context.Context, h Handler, j Job) {
	o := h(ctx, j)
	// Recording the outcome must not be lost to a stop: retry until it is
	// durable (a failing disk leaves the job claimed, and a restart sends
	// it again with the same Idempotency-Key).
	for attempt := 0; ; attempt++ {
		err := s.finish(j, o)
		if err == nil {
			return
		}
		s.log.Error("cannot record the outcome of an attempt", "job", j.ID, "err", err)
		if attempt >= 5 {
			return
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
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
	s.mu.Lock()
	var names []string
	for name, tm := range s.tenants {
		if tm.dirty {
			names = append(names, name)
		}
	}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, n := range names {
			if err := s.putTenant(tx, n); err != nil {
				return err
			}
		}
		return nil
	})
}

// evictIdle drops tenants whose state no longer matters from memory (their
// record stays on disk): memory grows with active tenants only.
func (s *BoltStore) evictIdle() {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, tm := range s.tenants {
		if tm.depth == 0 && tm.inFlight == 0 && tm.pending == 0 && !tm.dirty && leaky.Idle(leaky.State{TAT: tm.rec.TAT}, now) {
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
			var j Job
			if ok, _ := getJSON(jobs, []byte(id), &j); ok && j.IdempotencyKey != "" {
				if bytes.Equal(idem.Get(idemKey(j.Tenant, j.IdempotencyKey)), []byte(id)) {
					if err := idem.Delete(idemKey(j.Tenant, j.IdempotencyKey)); err != nil {
						return err
					}
				}
			}
			if err := jobs.Delete([]byte(id)); err != nil {
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
