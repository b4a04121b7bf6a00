// Command engines measures the embedded store's admission write pattern on
// bbolt (as internal/queue/bolt writes it) beside pebble, alternating the
// engines in rounds in one process. See README.md.
package main

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	bbolt "go.etcd.io/bbolt"
)

// admission is what one admitted job writes: its record into the jobs
// keyspace, id -> tenant into the waiting index, and the tenant's record
// appended to the tenant log.
type admission struct {
	id     []byte // 26 characters, sorts by creation time (queue.NewID)
	job    []byte // ~150 bytes
	tenant string
	rec    []byte // the tenant's record, ~80 bytes, its name first
}

// engine makes admissions durable: admit returns once an fsync covers a.
type engine interface {
	admit(a *admission) error
	// preload writes n waiting jobs without syncing each (then syncs).
	preload(n int, tenants int) error
	// stats returns engine counters for the report (commits, syncs).
	stats() (commits, grouped, syncs int64)
	close() error
}

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID is internal/queue's NewID: 48 bits of milliseconds, 80 random bits,
// Crockford base32 (26 characters).
func newID(now time.Time) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err)
	}
	out := make([]byte, idEncoding.EncodedLen(len(b)))
	idEncoding.Encode(out, b[:])
	return out
}

func tenantName(i int) string { return fmt.Sprintf("tenant-%04d", i) }

// payload is the JSON the store's own benchmark enqueues.
var payload = []byte(`{"worker":1,"n":12345,"text":"your code is 123456"}`)

// newAdmission builds the records of one admission of tenant t: a job
// record of 150 bytes (tenant, times, slot, cost, attempts, the inline
// payload, as codec.go's encodeJob lays them out, padded with random bytes
// where the real record has ids and deadlines) and the tenant's 80-byte
// record (name, counters, policy).
func newAdmission(now time.Time, t int, accepted int64) *admission {
	name := tenantName(t)
	job := make([]byte, 0, 150)
	job = append(job, byte(len(name)))
	job = append(job, name...)
	job = binary.BigEndian.AppendUint64(job, uint64(now.UnixNano()))
	job = binary.BigEndian.AppendUint64(job, uint64(now.Add(time.Hour).UnixNano()))
	job = binary.AppendUvarint(job, 1) // cost
	job = binary.AppendUvarint(job, 0) // attempts
	job = append(job, byte(len(payload)))
	job = append(job, payload...)
	pad := make([]byte, 150-len(job))
	_, _ = rand.Read(pad)
	job = append(job, pad...)

	rec := make([]byte, 0, 80)
	rec = append(rec, byte(len(name)))
	rec = append(rec, name...)
	rec = binary.BigEndian.AppendUint64(rec, uint64(accepted))
	rec = binary.BigEndian.AppendUint64(rec, uint64(now.UnixNano()))
	rec = binary.BigEndian.AppendUint64(rec, uint64(time.Hour))
	for len(rec) < 80 {
		rec = append(rec, byte(len(rec)))
	}
	return &admission{id: newID(now), job: job, tenant: name, rec: rec}
}

// maxGroup bounds the writes one group carries (internal/queue/bolt).
const maxGroup = 1000

// groupReq is one admission waiting for the committer.
type groupReq struct {
	a    *admission
	done chan error
}

// grouper is the store's committer (internal/queue/bolt/commit.go): one
// goroutine takes every write waiting (up to maxGroup) and writes them in
// one transaction, with no window.
type grouper struct {
	reqs     chan groupReq
	stop     chan struct{}
	finished chan struct{}
	write    func([]groupReq) error
	commits  atomic.Int64
	grouped  atomic.Int64
}

func newGrouper(write func([]groupReq) error) *grouper {
	g := &grouper{reqs: make(chan groupReq), stop: make(chan struct{}), finished: make(chan struct{}), write: write}
	go g.run()
	return g
}

func (g *grouper) submit(a *admission) error {
	r := groupReq{a: a, done: make(chan error, 1)}
	select {
	case g.reqs <- r:
	case <-g.stop:
		return errors.New("closed")
	}
	return <-r.done
}

func (g *grouper) run() {
	defer close(g.finished)
	group := make([]groupReq, 0, 64)
	for {
		group = group[:0]
		select {
		case r := <-g.reqs:
			group = append(group, r)
		case <-g.stop:
			return
		}
	gather:
		for len(group) < maxGroup {
			select {
			case r := <-g.reqs:
				group = append(group, r)
			default:
				break gather
			}
		}
		g.commits.Add(1)
		g.grouped.Add(int64(len(group)))
		err := g.write(group)
		for _, r := range group {
			r.done <- err
		}
	}
}

func (g *grouper) close() {
	close(g.stop)
	<-g.finished
}

// distinctTenants returns, of each tenant in the group, its last
// admission: the store writes each tenant's record once per group, as it is
// after every admission of the group (commit.go putTenants).
func distinctTenants(group []groupReq) []*admission {
	last := make(map[string]int, len(group))
	for i, r := range group {
		last[r.a.tenant] = i
	}
	out := make([]*admission, 0, len(last))
	for i, r := range group {
		if last[r.a.tenant] == i {
			out = append(out, r.a)
		}
	}
	return out
}

// ---- bbolt, as internal/queue/bolt ----

var (
	bucketJobs      = []byte("jobs")
	bucketWaiting   = []byte("waiting")
	bucketTenantLog = []byte("tenant-log")
)

type boltEngine struct {
	db *bbolt.DB
	g  *grouper
}

// openBolt opens the file with the options of internal/queue/bolt's Open.
func openBolt(path string) (*boltEngine, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketJobs, bucketWaiting, bucketTenantLog} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	e := &boltEngine{db: db}
	e.g = newGrouper(e.writeGroup)
	return e, nil
}

// writeGroup is commit.go's writeGroup: every admission's putJob and
// putWaiting, then each tenant's record once through logTenant, in one
// db.Update (two fdatasyncs).
func (e *boltEngine) writeGroup(group []groupReq) error {
	return e.db.Update(func(tx *bbolt.Tx) error {
		jobs, waiting := tx.Bucket(bucketJobs), tx.Bucket(bucketWaiting)
		for _, r := range group {
			if err := jobs.Put(r.a.id, r.a.job); err != nil {
				return err
			}
			if err := waiting.Put(r.a.id, []byte(r.a.tenant)); err != nil {
				return err
			}
		}
		log := tx.Bucket(bucketTenantLog)
		log.FillPercent = 1 // as tenants.go logTenant
		for _, a := range distinctTenants(group) {
			seq, err := log.NextSequence()
			if err != nil {
				return err
			}
			if err := log.Put(binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq), a.rec); err != nil {
				return err
			}
		}
		return nil
	})
}

func (e *boltEngine) admit(a *admission) error { return e.g.submit(a) }

func (e *boltEngine) preload(n, tenants int) error {
	const chunk = 10_000
	for done := 0; done < n; {
		err := e.db.Update(func(tx *bbolt.Tx) error {
			jobs, waiting := tx.Bucket(bucketJobs), tx.Bucket(bucketWaiting)
			now := time.Now()
			for i := 0; i < chunk && done < n; i++ {
				a := newAdmission(now, done%tenants, 0)
				if err := jobs.Put(a.id, a.job); err != nil {
					return err
				}
				if err := waiting.Put(a.id, []byte(a.tenant)); err != nil {
					return err
				}
				done++
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (e *boltEngine) stats() (int64, int64, int64) {
	c := e.g.commits.Load()
	return c, e.g.grouped.Load(), 2 * c
}

func (e *boltEngine) close() error {
	e.g.close()
	return e.db.Close()
}

// ---- pebble ----

// Keyspaces are prefixes of one keyspace.
const (
	prefixJob     = 'j'
	prefixWaiting = 'w'
	prefixLog     = 'l'
)

func key(prefix byte, id []byte) []byte {
	return append([]byte{prefix}, id...)
}

type pebbleEngine struct {
	db    *pebble.DB
	g     *grouper // nil: each writer commits its own batch
	seq   atomic.Uint64
	fs    *countingFS
	batch int // admissions per Commit in preload
}

// pebbleOptions are pebble's defaults, the WAL on (DisableWAL false, the
// default), and the newest on-disk format, as a new store would be created;
// its informational log is left out of the report.
func pebbleOptions(fs vfs.FS) *pebble.Options {
	return &pebble.Options{FS: fs, FormatMajorVersion: pebble.FormatNewest, Logger: quietLogger{}}
}

// quietLogger drops pebble's Infof (WAL replay, compactions), keeps the rest.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)              {}
func (quietLogger) Errorf(format string, args ...any) { pebble.DefaultLogger.Errorf(format, args...) }
func (quietLogger) Fatalf(format string, args ...any) { pebble.DefaultLogger.Fatalf(format, args...) }

func openPebble(dir string, grouped bool) (*pebbleEngine, error) {
	fs := &countingFS{FS: vfs.Default}
	db, err := pebble.Open(dir, pebbleOptions(fs))
	if err != nil {
		return nil, err
	}
	e := &pebbleEngine{db: db, fs: fs}
	// The tenant log's next sequence: after its last key.
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLog}, UpperBound: []byte{prefixLog + 1}})
	if err != nil {
		db.Close()
		return nil, err
	}
	if it.Last() {
		e.seq.Store(binary.BigEndian.Uint64(it.Key()[1:]))
	}
	if err := it.Close(); err != nil {
		db.Close()
		return nil, err
	}
	if grouped {
		e.g = newGrouper(e.writeGroup)
	}
	return e, nil
}

func (e *pebbleEngine) logKey() []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixLog}, e.seq.Add(1))
}

// admit: (a) one batch per admission, Commit with pebble.Sync, from every
// writer at once (pebble's commit pipeline and WAL writer group the
// syncs); (b) through the grouper, like bbolt.
func (e *pebbleEngine) admit(a *admission) error {
	if e.g != nil {
		return e.g.submit(a)
	}
	b := e.db.NewBatch()
	defer b.Close()
	if err := b.Set(key(prefixJob, a.id), a.job, nil); err != nil {
		return err
	}
	if err := b.Set(key(prefixWaiting, a.id), []byte(a.tenant), nil); err != nil {
		return err
	}
	if err := b.Set(e.logKey(), a.rec, nil); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

func (e *pebbleEngine) writeGroup(group []groupReq) error {
	b := e.db.NewBatch()
	defer b.Close()
	for _, r := range group {
		if err := b.Set(key(prefixJob, r.a.id), r.a.job, nil); err != nil {
			return err
		}
		if err := b.Set(key(prefixWaiting, r.a.id), []byte(r.a.tenant), nil); err != nil {
			return err
		}
	}
	for _, a := range distinctTenants(group) {
		if err := b.Set(e.logKey(), a.rec, nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

func (e *pebbleEngine) preload(n, tenants int) error {
	const chunk = 10_000
	for done := 0; done < n; {
		b := e.db.NewBatch()
		now := time.Now()
		for i := 0; i < chunk && done < n; i++ {
			a := newAdmission(now, done%tenants, 0)
			if err := b.Set(key(prefixJob, a.id), a.job, nil); err != nil {
				return err
			}
			if err := b.Set(key(prefixWaiting, a.id), []byte(a.tenant), nil); err != nil {
				return err
			}
			done++
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		b.Close()
	}
	if err := e.db.Flush(); err != nil {
		return err
	}
	// Let the compactions the load started finish, as they would have in a
	// store that filled over time.
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if e.db.Metrics().Compact.NumInProgress == 0 {
			break
		}
	}
	return nil
}

func (e *pebbleEngine) stats() (int64, int64, int64) {
	var c, g int64
	if e.g != nil {
		c, g = e.g.commits.Load(), e.g.grouped.Load()
	}
	return c, g, e.fs.walSyncs.Load()
}

func (e *pebbleEngine) close() error {
	if e.g != nil {
		e.g.close()
	}
	return e.db.Close()
}

// countingFS counts the syncs of WAL files (*.log), so the report can say
// how many admissions one WAL sync carried.
type countingFS struct {
	vfs.FS
	walSyncs atomic.Int64
}

func (fs *countingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &countingFile{File: f, n: &fs.walSyncs}, nil
}

func (fs *countingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *countingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

func (fs *countingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

type countingFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *countingFile) Sync() error     { f.n.Add(1); return f.File.Sync() }
func (f *countingFile) SyncData() error { f.n.Add(1); return f.File.SyncData() }

// sizeOf is the bytes a store's file or directory takes (file sizes, summed).
func sizeOf(path string) int64 {
	var n int64
	_ = filepath.Walk(path, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}
