package main

import (
	"encoding/binary"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bbolt "go.etcd.io/bbolt"
)

var engineNames = []string{"bbolt", "pebble", "pebble-group"}

// TestAdmittedAreKept checks the pattern each engine writes: every admitted
// job is in the jobs and waiting keyspaces after the store is reopened, and
// the tenant log holds a record per admission (pebble) or per tenant and
// group (the grouper).
func TestAdmittedAreKept(t *testing.T) {
	for _, name := range engineNames {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store")
			e, err := open(name, path)
			if err != nil {
				t.Fatal(err)
			}
			const writers, each = 8, 50
			ids := make(chan []byte, writers*each)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						a := newAdmission(time.Now(), (w*each+i)%10, int64(i))
						if len(a.job) != 150 || len(a.rec) != 80 || len(a.id) != 26 {
							t.Errorf("sizes: job %d, tenant record %d, id %d", len(a.job), len(a.rec), len(a.id))
						}
						if err := e.admit(a); err != nil {
							t.Error(err)
							return
						}
						ids <- a.id
					}
				}()
			}
			wg.Wait()
			close(ids)
			if err := e.close(); err != nil {
				t.Fatal(err)
			}
			jobs, logged := readBack(t, name, path)
			for id := range ids {
				if !jobs[string(id)] {
					t.Fatalf("job %s not kept", id)
				}
			}
			if len(jobs) != writers*each || logged == 0 || logged > writers*each {
				t.Fatalf("%d jobs, %d tenant log records, want %d jobs", len(jobs), logged, writers*each)
			}
		})
	}
}

// readBack returns the ids in both the jobs and the waiting keyspace, and
// the tenant log's length.
func readBack(t *testing.T, name, path string) (map[string]bool, int) {
	t.Helper()
	jobs := map[string]bool{}
	logged := 0
	if name == "bbolt" {
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.View(func(tx *bbolt.Tx) error {
			waiting := tx.Bucket(bucketWaiting)
			err := tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
				if waiting.Get(k) != nil && len(v) == 150 {
					jobs[string(k)] = true
				}
				return nil
			})
			logged = tx.Bucket(bucketTenantLog).Stats().KeyN
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return jobs, logged
	}
	db, err := pebble.Open(path, pebbleOptions(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	waiting := map[string]bool{}
	var lastSeq uint64
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		switch k[0] {
		case prefixJob:
			if len(it.Value()) == 150 {
				jobs[string(k[1:])] = true
			}
		case prefixWaiting:
			waiting[string(k[1:])] = true
		case prefixLog:
			seq := binary.BigEndian.Uint64(k[1:])
			if seq <= lastSeq {
				t.Fatalf("tenant log out of order: %d after %d", seq, lastSeq)
			}
			lastSeq = seq
			logged++
		}
	}
	for id := range jobs {
		if !waiting[id] {
			delete(jobs, id)
		}
	}
	return jobs, logged
}

// BenchmarkAdmit is a quick look at one engine at a time (64 writers, an
// empty store). The figures to decide on come from the command, which
// alternates the engines in rounds in one run: see README.md.
//
//	go test -run '^$' -bench Admit -benchtime 5s
func BenchmarkAdmit(b *testing.B) {
	for _, name := range engineNames {
		b.Run(name, func(b *testing.B) {
			e, err := open(name, filepath.Join(b.TempDir(), "store"))
			if err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(32) // x GOMAXPROCS (2): 64 writers
			cpu0 := processCPU()
			b.ResetTimer()
			var n int64
			var mu sync.Mutex
			b.RunParallel(func(pb *testing.PB) {
				var mine int64
				for i := 0; pb.Next(); i++ {
					if err := e.admit(newAdmission(time.Now(), i%1000, int64(i))); err != nil {
						b.Error(err)
						return
					}
					mine++
				}
				mu.Lock()
				n += mine
				mu.Unlock()
			})
			b.StopTimer()
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "admissions/s")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(max(n, 1))/1e3, "cpu-µs/admission")
			if err := e.close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}
