// Package owner gives each of the P partitions of a Redis-backed
// throttler to exactly one live worker at a time, through leases with
// epochs, and balances the partitions between the live workers. It owns
// the partition count, the hash of a tenant onto a partition, the lease
// and membership keys and their scripts, and the fence that an owner's
// writes check. What an owner does with a partition (pacing its tenants,
// sending, recording outcomes) is its user's: the Redis store.
//
// # Partitions
//
// A tenant belongs to partition PartitionOf(tenant, P). P is fixed per
// Redis: the first process records it (key
// throttler:{throttler-owner}:partitions), and a process configured with
// another count is refused with a *PartitionsError, at Start or, for a
// process that only admits jobs, at RecordPartitions. Every key of
// partition p begins with KeyPrefix(p) and carries the hash tag {Tag(p)},
// so a partition lives in one Cluster slot and one script can touch all
// of it; an asynq queue named Tag(p) shares the slot.
//
// # Leases and epochs
//
// Partition p is owned through its lease key, KeyPrefix(p)+"lease", whose
// value, the token "worker:epoch", names the owner and its tenure. A
// worker takes a free partition with SET NX PX in acquire.lua, which also
// INCRs the partition's epoch key (it never expires): every tenure has an
// epoch of its own, greater than the last. The owner renews by compare
// (renew.lua: only while the lease holds its token) every Renew, and gives
// the partition back by compare (release.lua). On a Redis that has no
// epoch for a partition (it is new, or Redis lost its data) the partition
// is first held vacant for one Lease, since an owner from before the loss
// may still believe in its lease for that long.
//
// # Lost before it lapses
//
// A worker counts each lease as lost Lease-Margin after it sent the last
// renewal that succeeded, measured on its own monotonic clock. Redis
// extended the lease from a later instant (when the renewal ran), so the
// worker stops at least Margin before anyone else can take the partition,
// whatever happened meanwhile: Redis unreachable, the network slow, the
// process frozen (when it runs again, its deadlines are past). Lost(p)
// tells the user at the deadline, from a timer; Holds(p, epoch) checks it
// synchronously, and a sender calls it right before each send, so that a
// frozen process that wakes up sends nothing new even before its timer
// has fired. A renewal Redis refuses (the lease is not the worker's) is
// lost at once.
//
// # Fencing: the contract for an owner's writes
//
// Every write of an owner that must not land once it has lost the
// partition runs as a fenced script: FenceLua in front of the script's own
// Lua (FencedScript), the partition's lease as KEYS[1] and the owner's
// token as ARGV[1] (Fence.Key, Fence.Token; Fence.Keys and Fence.Args put
// them in front; Fence.Run does all of it), the script's own keys and
// arguments from KEYS[2] and ARGV[2], every key under the partition's
// KeyPrefix. Before the script does anything, the fence refuses it unless
// the lease holds exactly that token: this worker, this epoch, unexpired.
// So a stale owner's write (its lease lapsed, and someone else took the
// partition in a new epoch, or nobody yet) is refused, in the same atomic
// step as the write would have been. Refused, it is the error reply
// "FENCED ...", which Fence.Run and Fence.Err return as a *FencedError
// (errors.Is(err, ErrFenced)). The writes of Drain pass: the lease is
// still held while Drain runs.
//
// # Balancing
//
// Every Balance a worker refreshes its heartbeat in a zset of worker id ->
// expiry (members.lua, which also drops the dead) and computes its fair
// share from the live workers, sorted by id: P/N each, the remainder one
// each to the first ids. Under its share it takes free partitions (no
// lease: it never takes a held one). Over it (a worker joined) it gives
// its surplus back cleanly: it calls Drain(ctx, p), the user stops sending
// for p and records what is under way, and only once Drain has returned
// does it release the lease, so the next owner may start at once. Stop
// does the same for every partition it holds: a clean handover. A worker
// that dies gives nothing back: its partitions are taken over after its
// leases expire in Redis, within Lease plus a Balance of its last renewal
// (its heartbeat, HeartbeatTTL, lapses about as soon).
//
// # Callbacks
//
// Acquired(p, epoch) starts a tenure; it ends with Lost(p) (stop sending
// for p at once: no Drain follows) or with Drain(ctx, p) (stop, record,
// return). Acquired and Lost are serialized and must return quickly;
// Drain may take its time (its context ends after DrainTimeout, a hint:
// the lease is released only once Drain returns, however long it takes,
// and renewed meanwhile). If the lease is lost while Drain runs, Lost(p)
// is called too, at once. No callback may call Stop.
//
// # The bound that remains
//
// A send to the downstream is not a write to Redis, and nothing makes
// "check Holds, then send" one step: a request already past its check when
// the process froze (or when Lost arrived) goes out when the process runs
// again, however late, possibly after the next owner has started. That is
// one request per sender in flight at the freeze, never more: the next
// check refuses, and every write to Redis after the takeover (its
// outcome, the tenant's state) is refused by the fence. The leases also
// assume that the worker's monotonic clock and Redis's clock run at the
// same rate within Margin/Lease (NTP slewing, not stepping, on the Redis
// host: Redis expires keys by its wall clock; and a suspend of the
// worker's whole machine, which stops its monotonic clock, is not seen:
// the fence still refuses its writes after one), and that Redis keeps what
// it acknowledged: with appendfsync everysec a crash of Redis's machine
// (not a kill of redis-server) can lose the last second of renewals, and
// a failover to a lagging replica the writes it had not received; keep
// Margin above that loss, or fsync always.
package owner

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/startstop"
)

// Defaults of Options.
const (
	PartitionsDefault   = 32
	LeaseDefault        = 5 * time.Second
	DrainTimeoutDefault = 10 * time.Second
)

// Options configure a Manager. Zero fields take their defaults; the
// durations derived from Lease follow the Lease given.
type Options struct {
	// Client is the connection to Redis (standalone, Sentinel or Cluster).
	// Required. Give it ContextTimeoutEnabled (or a ReadTimeout below
	// Renew): otherwise go-redis waits out its ReadTimeout on a Redis that
	// hangs, whatever the renewal's context says, and renewals come late
	// (the leases are still counted lost in time: that does not wait).
	Client goredis.UniversalClient
	// Partitions is P: every process on one Redis must give the same.
	// Default PartitionsDefault (32).
	Partitions int
	// WorkerID names this worker in leases and heartbeats; it must be
	// unique among live workers. Default hostname-pid-random.
	WorkerID string
	// Lease is how long a lease lasts without renewal: a crashed worker's
	// partitions are taken over about this long after its last renewal.
	// Default LeaseDefault (5 s).
	Lease time.Duration
	// Renew is how often the leases are renewed. Default Lease/3 (two
	// tries before a lease is lost); less than Lease-Margin.
	Renew time.Duration
	// Margin is how long before a lease could expire in Redis this worker
	// counts it lost: room for the stop to take effect and for clock-rate
	// differences. Default Lease/5.
	Margin time.Duration
	// Balance is how often the worker sends its heartbeat and looks at
	// its share. Default Lease/5.
	Balance time.Duration
	// HeartbeatTTL is how long a worker counts as live after its last
	// heartbeat. Default Lease; at least 2 Balance.
	HeartbeatTTL time.Duration
	// DrainTimeout ends the context given to Drain. Default
	// DrainTimeoutDefault (10 s).
	DrainTimeout time.Duration

	// Acquired, Lost and Drain are the user's part (see the package
	// comment); nil: nothing to do.
	Acquired func(partition int, epoch int64)
	Lost     func(partition int)
	Drain    func(ctx context.Context, partition int)

	Logger *slog.Logger
}

// withDefaults fills the zero fields and checks the rest.
func (o Options) withDefaults() (Options, error) {
	if o.Client == nil {
		return o, errors.New("owner: Options.Client is required")
	}
	o.Partitions = cmp.Or(o.Partitions, PartitionsDefault)
	o.Lease = cmp.Or(o.Lease, LeaseDefault)
	o.Renew = cmp.Or(o.Renew, o.Lease/3)
	o.Margin = cmp.Or(o.Margin, o.Lease/5)
	o.Balance = cmp.Or(o.Balance, o.Lease/5)
	o.HeartbeatTTL = cmp.Or(o.HeartbeatTTL, o.Lease)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, DrainTimeoutDefault)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	if o.WorkerID == "" {
		o.WorkerID = defaultWorkerID()
	}
	if o.Acquired == nil {
		o.Acquired = func(int, int64) {}
	}
	if o.Lost == nil {
		o.Lost = func(int) {}
	}
	if o.Drain == nil {
		o.Drain = func(context.Context, int) {}
	}
	switch {
	case o.Partitions < 1:
		return o, fmt.Errorf("owner: Partitions %d: want at least 1", o.Partitions)
	case o.Lease < 10*time.Millisecond:
		return o, fmt.Errorf("owner: Lease %v: want at least 10ms", o.Lease)
	case o.Margin <= 0 || o.Margin >= o.Lease:
		return o, fmt.Errorf("owner: Margin %v: want more than 0 and less than Lease (%v)", o.Margin, o.Lease)
	case o.Renew <= 0 || o.Renew >= o.Lease-o.Margin:
		return o, fmt.Errorf("owner: Renew %v: want more than 0 and less than Lease-Margin (%v), or leases are lost before they are renewed", o.Renew, o.Lease-o.Margin)
	case o.Balance <= 0 || o.HeartbeatTTL < 2*o.Balance:
		return o, fmt.Errorf("owner: Balance %v and HeartbeatTTL %v: want Balance more than 0 and HeartbeatTTL at least twice it", o.Balance, o.HeartbeatTTL)
	case o.DrainTimeout < 0:
		return o, fmt.Errorf("owner: DrainTimeout %v: want 0 (the default) or more", o.DrainTimeout)
	}
	return o, nil
}

func defaultWorkerID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "worker"), os.Getpid(), hex.EncodeToString(b))
}

// Manager holds this worker's share of the partitions. Its methods are
// safe for concurrent use.
type Manager struct {
	o   Options
	rdb goredis.UniversalClient
	log *slog.Logger

	// cbMu serializes Acquired and Lost, each with the change of held
	// behind it, so that a tenure's Lost never comes before its Acquired.
	cbMu sync.Mutex
	mu   sync.Mutex
	held map[int]*tenure

	renewer, balancer startstop.Periodic
	poke              chan struct{} // the watchdog looks at the deadlines again
	watchDone         chan struct{}
	trouble           troubles
	live              []string // the live workers the balancer last saw (its own)
	mismatch          bool     // the balancer last saw another count recorded (its own)

	life             sync.Mutex // Start and Stop
	started, stopped bool
	ctx              context.Context
	cancel           context.CancelFunc

	hooks hooks

	passMu sync.Mutex // the balancer's passes and the takes at a vacancy's end
	vacant vacancies
}

// tenure is one partition held: its epoch and when it counts as lost.
type tenure struct {
	epoch    int64
	deadline time.Time // monotonic: Lease-Margin after the last renewal sent that succeeded
	draining bool
}

// hooks let tests freeze a worker.
type hooks struct {
	frozen atomic.Bool // the renewer and the balancer skip their passes
	blind  atomic.Bool // the watchdog looks at no deadline
}

// New returns a Manager; it does nothing until Start.
func New(opts Options) (*Manager, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Manager{o: o, rdb: o.Client, log: o.Logger.With("worker", o.WorkerID),
		held: map[int]*tenure{}, poke: make(chan struct{}, 1), watchDone: make(chan struct{})}
	m.renewer = startstop.Periodic{Name: "partition lease renewer", Every: o.Renew, Run: m.unlessFrozen(m.renew)}
	m.balancer = startstop.Periodic{Name: "partition balancer", Every: o.Balance, Run: m.unlessFrozen(m.balance)}
	return m, nil
}

// unlessFrozen is pass, skipped while a test has frozen the worker (one
// check for both periodic passes, so that a new one cannot miss it).
func (m *Manager) unlessFrozen(pass func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		if !m.hooks.frozen.Load() {
			pass(ctx)
		}
	}
}

// Pause is for tests: while on, the worker's renewer, balancer and
// watchdog do nothing, as if its process were stopped (SIGSTOP), which a
// test cannot do to some goroutines and not to its own.
func (m *Manager) Pause(on bool) {
	m.hooks.frozen.Store(on)
	m.hooks.blind.Store(on)
}

// ID is this worker's id.
func (m *Manager) ID() string { return m.o.WorkerID }

// Partitions is P.
func (m *Manager) Partitions() int { return m.o.Partitions }

// Start checks P against its Redis (a *PartitionsError if they differ),
// joins the live workers and begins renewing, balancing and watching the
// deadlines. Cancelling ctx abandons every lease at once, as a crash
// would: Lost for each, no Drain, no release (they lapse in Redis after a
// Lease); Stop is the clean way out. Start once.
func (m *Manager) Start(ctx context.Context) error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.started {
		return errors.New("owner: Start called twice")
	}
	rep, err := members(ctx, m.rdb, m.o.Partitions, m.o.WorkerID, m.o.HeartbeatTTL)
	if err != nil {
		return err
	}
	if err := checkPartitions(m.o.Partitions, rep.Recorded); err != nil {
		return err
	}
	m.started = true
	m.ctx, m.cancel = context.WithCancel(ctx)
	m.log.Info("joined the partition owners", "partitions", m.o.Partitions, "live", len(rep.Live))
	go m.watch(m.ctx)
	m.renewer.Start(m.ctx)
	// A first pass now, not a Balance from now: on a new Redis the
	// vacancies begin (and end) that much sooner, and admission, which
	// promises an owner a lease after it finds a partition new, is nearer.
	m.unlessFrozen(m.balance)(m.ctx)
	m.balancer.Start(m.ctx)
	return nil
}

// Stop leaves the live workers, drains and releases every partition held
// (a clean handover: the next owners may start at once), and returns once
// everything it started has ended. Safe to call more than once, or
// without Start.
func (m *Manager) Stop() {
	m.life.Lock()
	defer m.life.Unlock()
	if !m.started || m.stopped {
		return
	}
	m.stopped = true
	m.balancer.Stop()
	m.stopRetakes()
	m.lockPass() // a take at a vacancy's end under way ends first
	m.unlockPass()
	if m.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), m.o.Renew)
		if err := m.rdb.ZRem(ctx, workersKey, m.o.WorkerID).Err(); err != nil {
			m.log.Warn("cannot leave the live workers; the heartbeat lapses by itself", "err", err)
		}
		cancel()
		m.giveBack(m.pick(-1))
	}
	m.cancel()
	m.renewer.Stop()
	<-m.watchDone
	m.log.Info("left the partition owners")
}

// Held is a partition this worker holds.
type Held struct {
	Partition int
	Epoch     int64
	Draining  bool // being given back: Drain runs
}

// Owned lists the partitions held now (by the local deadline), by number.
func (m *Manager) Owned() []Held {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []Held
	for p, t := range m.held {
		if now.Before(t.deadline) {
			out = append(out, Held{Partition: p, Epoch: t.epoch, Draining: t.draining})
		}
	}
	slices.SortFunc(out, func(a, b Held) int { return a.Partition - b.Partition })
	return out
}

// Holds is whether this worker holds partition p in epoch now, by its
// own clock: a sender checks it right before each send.
func (m *Manager) Holds(p int, epoch int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.held[p]
	return t != nil && t.epoch == epoch && time.Now().Before(t.deadline)
}

// Fence is the fence of the tenure of partition p held now (false: none).
func (m *Manager) Fence(p int) (Fence, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.held[p]
	if t == nil || !time.Now().Before(t.deadline) {
		return Fence{}, false
	}
	return Fence{Partition: p, Worker: m.o.WorkerID, Epoch: t.epoch}, true
}
