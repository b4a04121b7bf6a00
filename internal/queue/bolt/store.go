package bolt

import (
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

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/startstop"
)

// Buckets of the embedded store's file.
var (
	bucketJobs     = []byte("jobs")     // id -> Job without its payload (codec.go; JSON before)
	bucketPayloads = []byte("payloads") // id -> payload larger than inlinePayload, written once
	bucketWaiting  = []byte("waiting")  // id -> the job's place and tenant (encodeWaiting): the jobs that wait
	bucketDone     = []byte("done")     // finished_at + id -> nil: for the reaper
	bucketFailed   = []byte("failed")   // tenant + 0x00 + newest-first time + id -> nil
	bucketIdem     = []byte("idem")     // tenant + 0x00 + key -> id
	bucketTenants  = []byte("tenants")  // tenant -> rules.Record (codec.go; JSON before)
	bucketMeta     = []byte("meta")     // "clean" -> "1" after a clean stop
	// bucketTenantLog: sequence (8 bytes big endian) -> tenant name and
	// record, appended with each change of a tenant's record and moved into
	// bucketTenants by the maintainer, at a clean stop and at open (see
	// logTenant).
	bucketTenantLog = []byte("tenant-log")
	// bucketResponses: id -> the answer kept of the job's latest attempt
	// (codec.go), written once per answer beside the record, as a large
	// payload is, and removed with the job.
	bucketResponses = []byte("responses")
)

// bucketDue was the index of waiting jobs by slot (slot + id -> tenant)
// before bucketWaiting: its keys put each admission at a random place in a
// large tree, so a commit rewrote a page per job admitted. A file that has
// it is moved to bucketWaiting at open.
var bucketDue = []byte("due")

var keyClean = []byte("clean")

// Options configure the embedded store; zero values take defaults.
type Options struct {
	Clock  clock.Clock      // default clock.Real
	Policy queue.PolicyFunc // required
	// Ceiling gives a tenant's downstream ceiling (default: none).
	Ceiling queue.CeilingFunc
	// Caps gives a tenant's caps on attempts in flight (default: none).
	Caps queue.CapsFunc
	// PoliciesRead, if set, is given the policies the API set (PutPolicy)
	// before the store recovers, so that the backlog is respaced by the
	// policies in force; an error refuses the open.
	PoliciesRead func(map[string][]byte) error
	// OnExpired, if set, is told of each job that expires while waiting.
	OnExpired func(queue.Job)
	// Retention is how long finished jobs are kept. Default 72h.
	Retention time.Duration
	// InitialStartLag is the time a prompt send takes from durable to
	// written, until it has been measured (the send part of startLag; the
	// wait to be durable is measured from the first call). Default 0.
	InitialStartLag time.Duration
	Logger          *slog.Logger
	// Reserve is the room (bytes) kept for outcomes, cancels and the
	// maintainer: under it new jobs are refused with a
	// *queue.StoreFullError (DESIGN.md 6c). Default DefaultReserve; a
	// negative value does not enforce it.
	Reserve int64
}

// testHooks change a store for the package's tests (open); Open leaves
// them zero.
type testHooks struct {
	// logIdle replaces walApplyAfter: crash tests keep admissions in the
	// write-ahead log only, however slow the machine.
	logIdle time.Duration
	// fsSize replaces fsSize: the size of a filesystem no test can mount.
	fsSize func(dir string) (int64, error)
}

// Store is the embedded backend: one process, one bbolt file and its
// write-ahead log. Decisions are made in memory under one lock and made
// durable by group commit (commit.go) before Enqueue returns.
type Store struct {
	db     *bbolt.DB
	clock  clock.Clock
	opened time.Time // attempts from then on were this process's: its gate spaces from them
	// sendsUntil is the end of the lease on sending made durable (unix
	// ns; sendlease.go).
	sendsUntil    atomic.Int64
	leaseWarned   atomic.Int64 // when a failed renewal was last logged (unix ns)
	leaseRenewing atomic.Bool  // a renewal runs beside the sends
	policy        queue.PolicyFunc
	ceiling       queue.CeilingFunc
	caps          queue.CapsFunc
	onExpired     func(queue.Job)
	retention     time.Duration
	log           *slog.Logger
	finishes      queue.Finishes // who waits for a job's final state (?wait)

	mu       sync.Mutex
	tenants  map[string]*tenantMem
	idemWait map[string]chan struct{} // keys being admitted right now
	sched    schedule
	claims   map[string]queue.Job // jobs handed to the dispatcher, as handed over
	written  map[string]bool      // claims whose attempt's request is written (Wrote)
	// booked are the claims of jobs booked for their not_before: one
	// released unsent is booked again (counted in its tenant's scheduled).
	booked   map[string]bool
	handedAt map[string]time.Time  // when each claimed job was handed over
	fair     map[string]*fairQueue // by downstream: due jobs sharing its ceiling or its caps
	// capHeld are the counts each claim holds (caps.go); open, the claims
	// by tenant and by downstream; crashOpen, what a crash may have left
	// open at the vendor, by the same keys.
	capHeld   map[string]capKeys
	open      map[string]int
	crashOpen map[string]openAtCrash
	// cleanStart: the last stop was clean. After a crash a ceiling starts
	// one interval late: a send just before the crash may have used it.
	cleanStart  bool
	fairStarted map[string]bool

	// unapplied: admitted jobs durable in the write-ahead log and not yet
	// in the bbolt file, by id; unappliedKeys: their idempotency keys
	// (idemKey -> id). Reads look here first (commit.go).
	unapplied     map[string]*queue.Job
	unappliedKeys map[string]string

	finishQ chan finishReq
	commits chan commitReq // every write, for the committer (commit.go)
	// The committer's own: the write-ahead log, the bodies of its records
	// not yet in the bbolt file (one after the other: a sequence of
	// operations) and the jobs they admit, and scratch space for the
	// tenants' records.
	wal         *wal
	logged      []byte
	loggedJobs  int
	tenantRecs  []namedRecord
	tenantSeen  map[string]bool
	tenantEntry []byte
	logIdle     time.Duration // walApplyAfter, or testHooks.logIdle
	groups      atomic.Int64  // group commits made (for benchmarks)
	grouped     atomic.Int64  // writes they carried
	wake        chan struct{}
	nextWake    atomic.Int64 // unix ns the dispatcher plans to wake at
	lag         startLag
	stop        chan struct{}
	// background: the maintainer and the reaper; the finisher writes
	// outcomes until stop is closed.
	background   []*startstop.Periodic
	finisherDone chan struct{}
	// committerDone is closed when the committer has returned.
	committerDone chan struct{}
	closeErr      error
	closed        sync.Once
	space         *space // room left (space.go)
	// respaced: the jobs a restart moved whose records are still to be
	// written (writeRespaced's own once the store is open); respacedDone
	// is closed when it has returned.
	respaced     [][]respacedSlot // by tenant
	respacedDone chan struct{}
	// freelistAlways: every commit writes bbolt's list of free pages
	// (chooseFreelistSync), from Close on.
	freelistAlways bool
}

var (
	_ queue.Store = (*Store)(nil)
	_ queue.Space = (*Store)(nil)
)

// Open opens (creating if needed) the store at path. After a crash,
// jobs whose slot has passed may have been sent just before it: they are
// sent again (same Idempotency-Key), spaced from the last moment one of
// them could have gone, so a restart never sends a burst.
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts, testHooks{})
}

// open is Open with the tests' hooks.
func open(path string, opts Options, hooks testHooks) (*Store, error) {
	if opts.Policy == nil {
		return nil, errors.New("queue: Options.Policy is required")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("embedded store: create directory for %s: %w", path, err)
	}
	sizeOf := fsSize
	if hooks.fsSize != nil {
		sizeOf = hooks.fsSize
	}
	if err := checkReserve(path, cmp.Or(opts.Reserve, DefaultReserve), sizeOf); err != nil {
		return nil, err
	}
	// The freelist is written by commits only while it is short
	// (chooseFreelistSync): commits are what this store does most. An open
	// after a crash with a long one unwritten walks the file's pages to
	// find the free ones, O(file).
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bbolt.ErrTimeout) {
			return nil, fmt.Errorf("embedded store %s is locked by another process: stop the other throttler or use another store.path", path)
		}
		return nil, fmt.Errorf("embedded store %s: %w", path, err)
	}
	w, err := openWAL(walPath(path))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("embedded store %s: %w", path, err)
	}
	s := &Store{
		db:        db,
		wal:       w,
		logIdle:   cmp.Or(hooks.logIdle, walApplyAfter),
		clock:     cmp.Or[clock.Clock](opts.Clock, clock.Real{}),
		policy:    opts.Policy,
		ceiling:   opts.Ceiling,
		caps:      opts.Caps,
		onExpired: opts.OnExpired,
		fair:      map[string]*fairQueue{},
		capHeld:   map[string]capKeys{},
		open:      map[string]int{},
		crashOpen: map[string]openAtCrash{},

		fairStarted:   map[string]bool{},
		retention:     cmp.Or(opts.Retention, 72*time.Hour),
		log:           cmp.Or(opts.Logger, slog.Default()),
		tenants:       map[string]*tenantMem{},
		idemWait:      map[string]chan struct{}{},
		claims:        map[string]queue.Job{},
		booked:        map[string]bool{},
		unapplied:     map[string]*queue.Job{},
		unappliedKeys: map[string]string{},
		tenantSeen:    map[string]bool{},
		handedAt:      map[string]time.Time{},
		written:       map[string]bool{},
		lag:           startLag{durable: map[string]time.Time{}},
		sched:         schedule{lines: map[string]*line{}},
		wake:          make(chan struct{}, 1),
		finishQ:       make(chan finishReq),
		commits:       make(chan commitReq, maxGroup),
		stop:          make(chan struct{}),
	}
	if s.ceiling == nil {
		s.ceiling = noCeiling
	}
	if s.caps == nil {
		s.caps = noCaps
	}
	s.opened = s.clock.Now()
	s.space = &space{path: path, reserve: cmp.Or(opts.Reserve, DefaultReserve), db: db, log: s.log}
	s.lag.send.avg.Store(int64(opts.InitialStartLag))
	if free, err := fsFree(filepath.Dir(path)); err == nil && free < ballastSize {
		// The open writes the log's admissions into the file: on a full
		// disk, the ballast is what makes room for them.
		s.space.releaseBallast()
	}
	if opts.PoliciesRead != nil {
		all, err := readPolicies(db)
		if err == nil {
			err = opts.PoliciesRead(all)
		}
		if err != nil {
			w.close()
			db.Close()
			return nil, fmt.Errorf("embedded store %s: tenants' policies: %w", path, err)
		}
	}
	if err := s.recover(); err != nil {
		w.close()
		db.Close()
		return nil, fmt.Errorf("embedded store %s: recover: %w", path, err)
	}
	if err := dropMappedPages(db); err != nil {
		s.log.Warn("cannot let go of the store file's pages read at open", "err", err)
	}
	s.start()
	return s, nil
}

// start runs the recovered store's own goroutines: maintenance, the
// finisher, the committer and the writer of a restart's moves.
func (s *Store) start() {
	s.background = []*startstop.Periodic{s.newMaintainer(), s.newReaper()}
	for _, part := range s.background {
		part.Start(context.Background())
	}
	s.finisherDone = make(chan struct{})
	go s.finisher()
	s.committerDone = make(chan struct{})
	go s.committer()
	s.respacedDone = make(chan struct{})
	go s.writeRespaced()
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
func failedKey(j queue.Job) []byte {
	k := append([]byte(j.Tenant), 0, 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint64(k[len(j.Tenant)+1:], math.MaxUint64-uint64(j.FinishedAt.UnixNano()))
	return append(k, j.ID...)
}

func idemKey(tenant, key string) []byte {
	return append(append([]byte(tenant), 0), key...)
}

func getJSON(b *bbolt.Bucket, key []byte, v any) (bool, error) {
	raw := b.Get(key)
	if raw == nil {
		return false, nil
	}
	return true, json.Unmarshal(raw, v)
}

func putJSON(b *bbolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

// putJob writes a job's record. A small payload is kept in it (codec.go):
// j's, or if j comes without one, the one the record has; a large one is in
// bucketPayloads (putAdmitted).
func putJob(tx *bbolt.Tx, j queue.Job) error {
	b := tx.Bucket(bucketJobs)
	key := []byte(j.ID)
	inline := j.Payload
	switch {
	case len(inline) > inlinePayload:
		inline = nil
	case inline == nil:
		if raw := b.Get(key); raw != nil {
			_, old, err := decodeJob(raw, j.ID)
			if err != nil {
				return err
			}
			inline = slices.Clone(old) // raw is the page's, and Put may move it
		}
	}
	if err := b.Put(key, encodeJob(make([]byte, 0, 128+len(inline)), j, inline)); err != nil {
		return err
	}
	if j.State.Waiting() {
		return putWaiting(tx, j) // its place, as a restart reads it
	}
	return nil
}

// getJob reads a job's record, with its payload if withPayload.
func getJob(tx *bbolt.Tx, id string, withPayload bool) (queue.Job, bool, error) {
	raw := tx.Bucket(bucketJobs).Get([]byte(id))
	if raw == nil {
		return queue.Job{}, false, nil
	}
	j, inline, err := decodeJob(raw, id)
	if err != nil {
		return j, false, err
	}
	if withPayload {
		if inline != nil {
			j.Payload = slices.Clone(inline)
		} else {
			j.Payload = slices.Clone(tx.Bucket(bucketPayloads).Get([]byte(id)))
		}
	}
	return j, true, nil
}

// getShown reads a job as Job shows it: its record, its payload and the
// answer kept of its latest attempt.
func getShown(tx *bbolt.Tx, id string) (queue.Job, bool, error) {
	j, found, err := getJob(tx, id, true)
	if err != nil || !found {
		return j, found, err
	}
	if j.Response, err = getResponse(tx, id); err != nil {
		return j, true, err
	}
	j.CallbackStatus, err = getCallback(tx, id)
	return j, true, err
}

// getResponse reads the answer kept of job id's latest attempt (nil:
// none).
func getResponse(tx *bbolt.Tx, id string) (*queue.Response, error) {
	raw := tx.Bucket(bucketResponses).Get([]byte(id))
	if raw == nil {
		return nil, nil
	}
	return decodeResponse(raw)
}

// putWaiting adds a job to the index of waiting jobs, or writes its place
// there anew. Its key is the id, which sorts by creation time: admissions
// append to the index.
func putWaiting(tx *bbolt.Tx, j queue.Job) error {
	var scratch [64]byte
	return tx.Bucket(bucketWaiting).Put([]byte(j.ID), encodeWaiting(scratch[:0], j))
}

// delWaiting takes a job out of the index of waiting jobs.
func delWaiting(tx *bbolt.Tx, id string) error {
	return tx.Bucket(bucketWaiting).Delete([]byte(id))
}

// Ping implements queue.Store. A full store answers its
// *queue.StoreFullError: it is reachable, but takes no new jobs.
func (s *Store) Ping(ctx context.Context) error {
	err := queue.Unavailable(s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketJobs) == nil {
			return errors.New("jobs bucket missing")
		}
		return nil
	}))
	if err != nil {
		return err
	}
	if st := s.Room(); st.Full {
		return st.Err
	}
	return nil
}

// Room implements queue.Space.
func (s *Store) Room() queue.SpaceStatus { return s.space.room(s.clock.Now()) }

// Close stops maintenance and closes the file. Call it after Consume returned.
func (s *Store) Close() error {
	s.closed.Do(func() {
		for _, part := range s.background {
			part.Stop()
		}
		close(s.stop)
		<-s.respacedDone
		<-s.finisherDone
		<-s.committerDone
		// The last commits write bbolt's list of free pages, however long
		// (chooseFreelistSync): the next open reads it instead of walking
		// every page of the file to find them.
		s.freelistAlways = true
		if len(s.logged) > 0 {
			s.closeErr = s.updateTx(func(*bbolt.Tx) error { return nil }) // the log into the bbolt file
		}
		if s.closeErr == nil {
			s.closeErr = s.flushDirty()
		}
		if s.closeErr == nil {
			s.closeErr = s.markClean()
		}
		if err := s.db.Close(); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
		if err := s.wal.close(); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// markClean records a clean stop: no job is being sent, so none whose slot
// passed was sent without its outcome being recorded.
func (s *Store) markClean() error {
	s.mu.Lock()
	active := len(s.claims)
	s.mu.Unlock()
	if active > 0 {
		return nil
	}
	return s.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyClean, []byte("1"))
	})
}

// isClosing reports whether Close has begun.
func (s *Store) isClosing() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// WatchFinish implements queue.Store: every final state is written by
// this process, which tells its watchers once the write is durable.
func (s *Store) WatchFinish(id string) (<-chan struct{}, func()) { return s.finishes.Watch(id) }

// Clock implements queue.Store: Options.Clock, the machine's by default.
func (s *Store) Clock() clock.Clock { return s.clock }
