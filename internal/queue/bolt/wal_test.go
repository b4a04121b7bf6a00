package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

// applyLog has the committer write what the write-ahead log holds into the
// bbolt file, for tests that read the file itself.
func applyLog(t *testing.T, s *Store) {
	t.Helper()
	if err := s.update(func(*bbolt.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// inFile reports whether the bbolt file itself has the job's record.
func inFile(t *testing.T, s *Store, id string) bool {
	t.Helper()
	var found bool
	if err := s.db.View(func(tx *bbolt.Tx) error {
		found = tx.Bucket(bucketJobs).Get([]byte(id)) != nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// Admissions are answered once the log has them, and the bbolt file gets
// them later: in between, a kill -9 must lose none of them, nor their
// payloads, keys or their tenant's count.
func TestAdmissionsOnlyInTheLogSurviveACrash(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s := c.s
	large := queue.NewJob{Payload: []byte(`"` + strings.Repeat("x", inlinePayload) + `"`)}
	keyed := queue.NewJob{Payload: []byte(`{"k":1}`), IdempotencyKey: "k1"}
	var ids []string
	for _, nj := range []queue.NewJob{queuetest.Payload(0), large, keyed} {
		ids = append(ids, queuetest.EnqueueOne(t, s, "acme", nj).Job.ID)
	}
	for _, id := range ids {
		if inFile(t, s, id) {
			t.Fatalf("job %s is in the bbolt file already: this test needs it in the log only", id)
		}
	}
	// Read from memory meanwhile: the job, and a repeat of its key.
	if j, err := s.Job(context.Background(), ids[1]); err != nil || !bytes.Equal(j.Payload, large.Payload) {
		t.Fatalf("Job of an admission in the log only: %v (payload %d bytes)", err, len(j.Payload))
	}
	if again := queuetest.EnqueueOne(t, s, "acme", keyed); again.Job.ID != ids[2] {
		t.Fatalf("a repeat of key k1 while its job is in the log only got %s, want %s", again.Job.ID, ids[2])
	}

	crashed := crashCopy(t, s)
	r := c.open(t, crashed)
	for i, id := range ids {
		j, err := r.Job(context.Background(), id)
		if err != nil {
			t.Fatalf("job %d (%s) after the crash: %v", i, id, err)
		}
		if j.State != queue.StateQueued {
			t.Errorf("job %d after the crash is %s, want queued", i, j.State)
		}
	}
	if j, _ := r.Job(context.Background(), ids[1]); !bytes.Equal(j.Payload, large.Payload) {
		t.Errorf("the large payload after the crash is %d bytes, want %d", len(j.Payload), len(large.Payload))
	}
	if again := queuetest.EnqueueOne(t, r, "acme", keyed); again.Job.ID != ids[2] {
		t.Errorf("key k1 after the crash got %s, want %s", again.Job.ID, ids[2])
	}
	if st, _ := r.Tenant(context.Background(), "acme"); st.Accepted != 3 || st.QueueDepth != 3 {
		t.Errorf("after the crash: accepted %d, depth %d; want 3 and 3", st.Accepted, st.QueueDepth)
	}
	if !inFile(t, r, ids[0]) {
		t.Error("after the open the log's jobs are not in the bbolt file")
	}
}

// A record already in the bbolt file stays in the log until it is written
// over: replaying it again would undo what came after (here, a cancel).
func TestAnOldRecordIsNotReplayed(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s := c.s
	id := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(0)).Job.ID
	applyLog(t, s)
	if _, err := s.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r := c.open(t, crashCopy(t, s))
	if j, err := r.Job(context.Background(), id); err != nil || j.State != queue.StateCancelled {
		t.Fatalf("after the crash the cancelled job is %s (%v), want cancelled", j.State, err)
	}
	if st, _ := r.Tenant(context.Background(), "acme"); st.QueueDepth != 0 {
		t.Fatalf("after the crash depth %d, want 0", st.QueueDepth)
	}
}

// The log is written from its start again once the bbolt file has it all:
// a crash after that must bring back the new records, not the old ones
// beyond them.
func TestTheLogWrittenOverReplaysTheNewRecords(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s := c.s
	var old []string
	for i := range 3 {
		old = append(old, queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i)).Job.ID)
	}
	applyLog(t, s)
	for _, id := range old[1:] {
		if _, err := s.Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	fresh := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(9)).Job.ID // over the first old record
	r := c.open(t, crashCopy(t, s))
	want := map[string]queue.JobState{old[0]: queue.StateQueued, old[1]: queue.StateCancelled, old[2]: queue.StateCancelled, fresh: queue.StateQueued}
	for id, st := range want {
		if j, err := r.Job(context.Background(), id); err != nil || j.State != st {
			t.Errorf("job %s after the crash: %s (%v), want %s", id, j.State, err, st)
		}
	}
}

// A record torn by the crash was never answered (a group is answered after
// its fdatasync): it is dropped, and every record before it kept.
func TestATornRecordIsDropped(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s := c.s
	first := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(0)).Job.ID
	second := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1)).Job.ID
	crashed := crashCopy(t, s)
	log, err := os.ReadFile(walPath(crashed))
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint32(log))
	tear := walHeader + n + walHeader + 2 // inside the second record's body
	log[tear] ^= 0xff
	if err := os.WriteFile(walPath(crashed), log, 0o600); err != nil {
		t.Fatal(err)
	}
	r := c.open(t, crashed)
	if _, err := r.Job(context.Background(), first); err != nil {
		t.Errorf("the record before the torn one: %v", err)
	}
	if _, err := r.Job(context.Background(), second); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("the torn record's job: %v, want not found", err)
	}
	if st, _ := r.Tenant(context.Background(), "acme"); st.QueueDepth != 1 {
		t.Errorf("depth %d after the crash, want 1", st.QueueDepth)
	}
}

// logOnlyOpener opens stores (deep queues, a fake clock) that keep
// admissions in the log until walApplyJobs or walApplyBytes, never after a
// quiet spell: what a test wrote is still in the log only at its crash.
func logOnlyOpener(t *testing.T) func(path string) *Store {
	clk := clock.NewFake(queuetest.T0)
	return func(path string) *Store {
		s, err := open(path, Options{Clock: clk, Policy: queuetest.Leaky20(20000)}, testHooks{logIdle: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// More admissions than one transaction takes from the log (walApplyJobs),
// then a crash: every one of them is back, those in the file and those in
// the log only.
func TestManyAdmissionsThroughTheLog(t *testing.T) {
	t.Parallel()
	open := logOnlyOpener(t)
	s := open(filepath.Join(t.TempDir(), "live.db"))
	var ids []string
	batch := make([]queue.NewJob, 100)
	for i := range batch {
		batch[i] = queuetest.Payload(i)
	}
	for range (walApplyJobs + 1500) / len(batch) {
		out, err := s.Enqueue(context.Background(), "acme", batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range out {
			if a.Rejected != nil {
				t.Fatalf("refused: %v", a.Rejected)
			}
			ids = append(ids, a.Job.ID)
		}
	}
	if !inFile(t, s, ids[0]) || inFile(t, s, ids[len(ids)-1]) {
		t.Fatal("want the first admissions in the file and the last in the log only")
	}
	r := open(crashCopy(t, s))
	for _, id := range ids {
		if _, err := r.Job(context.Background(), id); err != nil {
			t.Fatalf("job %s after the crash: %v", id, err)
		}
	}
	if st, _ := r.Tenant(context.Background(), "acme"); st.QueueDepth != len(ids) {
		t.Fatalf("depth %d after the crash, want %d", st.QueueDepth, len(ids))
	}
}

// A write the log has no room left for sends what the log holds into the
// file first and then takes the log from its start; a write larger than
// the whole log goes into the file directly. Neither loses a job or a
// payload across a crash.
func TestALargeWriteFindsRoomInTheLog(t *testing.T) {
	t.Parallel()
	open := logOnlyOpener(t)
	s := open(filepath.Join(t.TempDir(), "live.db"))
	payloads := map[string]string{}
	enqueue := func(jobs int) []string {
		t.Helper()
		batch := make([]queue.NewJob, jobs)
		for i := range batch {
			pad := strings.Repeat(string(rune('a'+len(payloads)%26)), 100<<10)
			batch[i] = queue.NewJob{Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, len(payloads)+i, pad))}
		}
		out, err := s.Enqueue(context.Background(), "acme", batch)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(out))
		for i, a := range out {
			if a.Rejected != nil {
				t.Fatalf("refused: %v", a.Rejected)
			}
			ids[i] = a.Job.ID
			payloads[a.Job.ID] = string(batch[i].Payload)
		}
		return ids
	}
	first := enqueue(19) // 1.9 MiB: below walApplyBytes, in the log only
	if inFile(t, s, first[0]) {
		t.Fatal("the first write is in the file already: the test needs it in the log only")
	}
	second := enqueue(65) // 6.5 MiB: no room after the first
	if !inFile(t, s, first[0]) || !inFile(t, s, second[0]) {
		// The first goes into the file to make room; the second fills the
		// log past walApplyBytes and follows it.
		t.Fatal("want the first and second writes in the file")
	}
	third := enqueue(1)   // in the log only
	fourth := enqueue(90) // 9 MiB: larger than the log
	if !inFile(t, s, third[0]) || !inFile(t, s, fourth[0]) {
		t.Fatal("want the third and fourth writes in the file")
	}
	fifth := enqueue(1) // in the log only, after all that
	if inFile(t, s, fifth[0]) {
		t.Fatal("want the fifth write in the log only")
	}
	r := open(crashCopy(t, s))
	for _, id := range slices.Concat(first, second, third, fourth, fifth) {
		j, err := r.Job(context.Background(), id)
		if err != nil {
			t.Fatalf("job %s after the crash: %v", id, err)
		}
		if string(j.Payload) != payloads[id] {
			t.Fatalf("job %s after the crash: payload of %d bytes, want %d", id, len(j.Payload), len(payloads[id]))
		}
	}
	if st, _ := r.Tenant(context.Background(), "acme"); st.QueueDepth != len(payloads) {
		t.Fatalf("depth %d after the crash, want %d", st.QueueDepth, len(payloads))
	}
}

// FuzzWALReplay: whatever the log file holds, replay reads it without a
// panic, takes only whole records that follow one another, and writing them
// is at worst an error.
func FuzzWALReplay(f *testing.F) {
	body := appendPut(nil, walJobs, []byte("id"), []byte{jobRecordV1})
	good := frame(nil, 1, body)
	f.Add(good)
	f.Add(append(good, frame(nil, 2, appendTenantLog(nil, []byte("x")))...))
	f.Add(frame(nil, 1, []byte{opPut, 9, 0, 0}))
	f.Add([]byte{})
	db, err := bbolt.Open(filepath.Join(f.TempDir(), "x.db"), 0o600, nil)
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	errRollBack := errors.New("roll back")
	f.Fuzz(func(t *testing.T, data []byte) {
		recs := parseWAL(data, 0)
		for i, r := range recs {
			if r.seq != uint64(i+1) {
				t.Fatalf("record %d has seq %d", i, r.seq)
			}
		}
		err := db.Update(func(tx *bbolt.Tx) error {
			for _, b := range [][]byte{bucketJobs, bucketPayloads, bucketWaiting, bucketIdem, bucketTenantLog} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			for _, r := range recs {
				if err := applyOps(tx, r.body); err != nil {
					return errRollBack // a bad record is an error, never a panic
				}
			}
			return errRollBack
		})
		if !errors.Is(err, errRollBack) {
			t.Fatal(err)
		}
	})
}
