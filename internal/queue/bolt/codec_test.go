package bolt

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/rules"
)

func TestJobRecordRoundTrip(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	jobs := []queue.Job{
		{ID: "a", Tenant: "acme", State: queue.StateQueued, EnqueuedAt: t0, DispatchAt: t0.Add(time.Second), Slot: t0.Add(time.Second)},
		{ID: "b", Tenant: "t+é@x", State: queue.StateFailed, IdempotencyKey: "k 1", Attempts: 5, Failures: 4, Cost: 3,
			EnqueuedAt: t0, DispatchAt: t0, Deadline: time.Unix(0, 0), SentAt: t0.Add(time.Millisecond),
			FinishedAt: t0.Add(2 * time.Millisecond), LastError: "503 Service Unavailable", ResponseStatus: 503,
			AdmitDelay: 1500 * time.Microsecond, AdmitDepth: 7, Prompt: true, Request: &queue.JobRequest{Path: "/v1/x"}},
		{ID: "c", State: queue.StateExpired, Deadline: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), Slot: time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)},
		{ID: "d", State: queue.JobState("some-future-state")},
		{ID: "e", State: queue.StateSucceeded, Type: "sms:otp", Callback: &queue.JobCallback{URL: "https://app.example/hooks/x", On: []queue.JobState{queue.StateFailed}}},
	}
	for _, st := range jobStates[1:] {
		jobs = append(jobs, queue.Job{ID: "s", State: st})
	}
	for i, j := range jobs {
		payload := [][]byte{nil, []byte(`{"n":1}`), {}}[i%3]
		got, inline, err := decodeJob(encodeJob(nil, j, payload), j.ID)
		if err != nil {
			t.Fatalf("%s: %v", j.ID, err)
		}
		if !sameJob(got, j) || string(inline) != string(payload) || (inline == nil) != (payload == nil) {
			t.Fatalf("round trip\n got %+v %q\nwant %+v %q", got, inline, j, payload)
		}
		// A record written as JSON by earlier versions reads the same.
		raw, _ := json.Marshal(j)
		old, inline, err := decodeJob(raw, j.ID)
		if err != nil || !sameJob(old, j) || inline != nil {
			t.Fatalf("JSON record: %v\n got %+v\nwant %+v", err, old, j)
		}
	}
	full := encodeJob(nil, jobs[1], []byte(`{"n":1}`))
	for n := range len(full) {
		if _, _, err := decodeJob(full[:n], "b"); err == nil {
			t.Fatalf("a record cut to %d of %d bytes was read", n, len(full))
		}
		if _, err := decodeWaiting(full[:n]); err == nil {
			t.Fatalf("a record cut to %d of %d bytes was read for a restart", n, len(full))
		}
	}
}

// sameJob compares jobs with times by Equal (a location is not kept).
func sameJob(a, b queue.Job) bool {
	times := func(j *queue.Job) []*time.Time {
		return []*time.Time{&j.EnqueuedAt, &j.DispatchAt, &j.Slot, &j.Deadline, &j.SentAt, &j.FinishedAt}
	}
	ta, tb := times(&a), times(&b)
	for i := range ta {
		if !ta[i].Equal(*tb[i]) || ta[i].IsZero() != tb[i].IsZero() {
			return false
		}
		*ta[i], *tb[i] = time.Time{}, time.Time{}
	}
	a.Payload, b.Payload = nil, nil
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// A file written before the index of waiting jobs was keyed by id (JSON
// records, a due index by slot) opens with its jobs waiting in slot order.
func TestOpensAFileWithTheOldDueIndex(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	path := filepath.Join(t.TempDir(), "old.db")
	policy := queuetest.Leaky20(10)
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketJobs, bucketPayloads, bucketDue, bucketDone, bucketFailed, bucketIdem, bucketTenants, bucketMeta} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketMeta).Put(keyClean, []byte("1")); err != nil {
			return err
		}
		// Two jobs, the later-made one due first.
		for i, delay := range []time.Duration{200 * time.Millisecond, 100 * time.Millisecond} {
			j := queue.Job{ID: queue.NewID(queuetest.T0.Add(time.Duration(i) * time.Millisecond)), Tenant: "acme", State: queue.StateQueued,
				EnqueuedAt: queuetest.T0, DispatchAt: queuetest.T0.Add(delay), Slot: queuetest.T0.Add(delay)}
			ids = append(ids, j.ID)
			raw, _ := json.Marshal(j)
			if err := tx.Bucket(bucketJobs).Put([]byte(j.ID), raw); err != nil {
				return err
			}
			if err := tx.Bucket(bucketPayloads).Put([]byte(j.ID), []byte(`{"n":1}`)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketDue).Put(dueKey(j.Slot, j.ID), []byte("acme")); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketTenants).Put([]byte("acme"), []byte(`{"tat":"`+queuetest.T0.Add(250*time.Millisecond).Format(time.RFC3339Nano)+`"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path, Options{Clock: clk, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, _ := s.Tenant(context.Background(), "acme"); st.QueueDepth != 2 {
		t.Fatalf("depth %d after open, want 2", st.QueueDepth)
	}
	got := make(chan queuetest.Handed, 2)
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200}
	})
	defer stop()
	first := queuetest.WaitHanded(t, clk, got, time.Millisecond)
	second := queuetest.WaitHanded(t, clk, got, time.Millisecond)
	if first.Job.ID != ids[1] || second.Job.ID != ids[0] || string(first.Job.Payload) != `{"n":1}` {
		t.Fatalf("handed %s then %s, want %s then %s", first.Job.ID, second.Job.ID, ids[1], ids[0])
	}
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketDue) != nil {
			t.Error("the old due index is still there")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestTenantRecordRoundTrip(t *testing.T) {
	t.Parallel()
	// The codec writes every field of TenantRecord: a new one must be
	// added to it (and here).
	if n := reflect.TypeFor[rules.Record]().NumField(); n != 14 {
		t.Fatalf("rules.Record has %d fields; encodeTenant and decodeTenant know 14: add the new one to both", n)
	}
	if n := reflect.TypeFor[leaky.Pause]().NumField(); n != 3 {
		t.Fatalf("leaky.Pause has %d fields; encodeTenant and decodeTenant know 3: add the new one to both", n)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	recs := []rules.Record{
		{},
		{TAT: t0, LastAttemptAt: t0.Add(-time.Second), LastAttemptCost: 4, Accepted: 1 << 40, Rejected: 2, Delivered: 3, Failed: 4, Cancelled: 5, Expired: 6},
		{TAT: t0, Pause: leaky.Pause{Shift: -3 * time.Second, Until: t0.Add(time.Minute), Held: t0}, Windows: map[string][]int64{"1000/d": {1, -2, t0.UnixNano()}, "5/s": {}}},
		{TAT: t0, LastAttemptCost: 2, Booked: []rules.Booking{{Slot: t0.UnixNano(), Job: "a"}, {Slot: t0.Add(time.Second).UnixNano(), Cost: 3, Job: "b"}}},
		{TAT: t0, Behind: t0.Add(340 * time.Millisecond)},
		{TAT: t0, Windows: map[string][]int64{"5/s": {t0.UnixNano()}}, Sent: map[string][]int64{"5/s": {t0.UnixNano(), -7}, "2/h": {}}},
	}
	for i, r := range recs {
		got, err := decodeTenant(encodeTenant(nil, r))
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		want, _ := json.Marshal(r)
		have, _ := json.Marshal(got)
		if string(want) != string(have) {
			t.Fatalf("%d: round trip\n got %s\nwant %s", i, have, want)
		}
		old, err := decodeTenant(want)
		if err != nil {
			t.Fatalf("%d: JSON record: %v", i, err)
		}
		if again, _ := json.Marshal(old); string(again) != string(want) {
			t.Fatalf("%d: JSON record\n got %s\nwant %s", i, again, want)
		}
		full := encodeTenant(nil, r)
		if len(r.Sent) > 0 {
			continue // the older versions below cannot hold it
		}
		// Version 4, before Sent: the same bytes without the last one
		// (its count, zero).
		v4 := append([]byte{tenantRecordV4}, full[1:len(full)-1]...)
		if old, err := decodeTenant(v4); err != nil || !reflect.DeepEqual(old, got) {
			t.Fatalf("%d: version 4 record: %+v, %v; want %+v", i, old, err, got)
		}
		full = full[:len(full)-1]
		if r.Behind.IsZero() {
			// Version 3, before Behind: the same bytes without the last
			// one (its zero).
			v3 := append([]byte{tenantRecordV3}, full[1:len(full)-1]...)
			if old, err := decodeTenant(v3); err != nil || !reflect.DeepEqual(old, got) {
				t.Fatalf("%d: version 3 record: %+v, %v; want %+v", i, old, err, got)
			}
		}
		if len(r.Booked) == 0 && r.Behind.IsZero() {
			// Version 2, before the bookings: one byte fewer again (their
			// count).
			v2 := append([]byte{tenantRecordV2}, full[1:len(full)-2]...)
			if old, err := decodeTenant(v2); err != nil || !reflect.DeepEqual(old, got) {
				t.Fatalf("%d: version 2 record: %+v, %v; want %+v", i, old, err, got)
			}
			if r.LastAttemptCost == 0 {
				// Version 1, before LastAttemptCost: one byte fewer again.
				v1 := append([]byte{tenantRecordV1}, full[1:len(full)-3]...)
				if old, err := decodeTenant(v1); err != nil || !reflect.DeepEqual(old, got) {
					t.Fatalf("%d: version 1 record: %+v, %v; want %+v", i, old, err, got)
				}
			}
		}
		for n := range len(full) {
			if _, err := decodeTenant(full[:n]); err == nil {
				t.Fatalf("%d: a record cut to %d of %d bytes was read", i, n, len(full))
			}
		}
	}
}

// A tenant's record is appended to the tenant log with each admission: a
// crash before the maintainer writes it in place loses nothing of it.
func TestTenantLogSurvivesACrash(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s := c.s
	for i := range 3 {
		queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i))
	}
	crashed := filepath.Join(c.dir, "crashed.db")
	applyLog(t, s)
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketTenantLog).Stats().KeyN == 0 {
			t.Error("nothing in the tenant log after admissions")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.snapshot(crashed); err != nil {
		t.Fatal(err)
	}
	r := c.open(t, crashed)
	if st, _ := r.Tenant(context.Background(), "acme"); st.Accepted != 3 || st.QueueDepth != 3 {
		t.Fatalf("after the crash: accepted %d, depth %d; want 3 and 3", st.Accepted, st.QueueDepth)
	}
	next := queuetest.EnqueueOne(t, r, "acme", queuetest.Payload(3))
	if next.Job.DispatchAt.Before(queuetest.T0.Add(3 * time.Second)) {
		t.Fatalf("a job admitted after the crash is due at %v: the schedule of the three before was lost", next.Job.DispatchAt.Sub(queuetest.T0))
	}
	if err := r.db.View(func(tx *bbolt.Tx) error {
		if n := tx.Bucket(bucketTenantLog).Stats().KeyN; n > 1 {
			t.Errorf("%d entries in the tenant log after open and one admission, want the log replayed", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Small payloads live in the job's record, large ones apart; both come back
// with the job handed over, after outcomes that rewrite the record, and
// after a retry.
func TestPayloadsInlineAndApart(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: queuetest.Leaky20(10)}).(*Store)
	small := []byte(`{"n":1}`)
	large := []byte(`"` + strings.Repeat("x", inlinePayload) + `"`)
	a := queuetest.EnqueueOne(t, s, "acme", queue.NewJob{Payload: small})
	b := queuetest.EnqueueOne(t, s, "acme", queue.NewJob{Payload: large})
	applyLog(t, s)
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketPayloads).Get([]byte(a.Job.ID)) != nil || tx.Bucket(bucketPayloads).Get([]byte(b.Job.ID)) == nil {
			t.Error("want the small payload in its record only, the large one apart")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := make(chan queuetest.Handed, 4)
	var attempts atomic.Int32
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		if attempts.Add(1) <= 2 {
			return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400"} // failed for good: retried below
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200}
	})
	defer stop()
	want := map[string]string{a.Job.ID: string(small), b.Job.ID: string(large)}
	for range 2 {
		h := queuetest.WaitHanded(t, clk, got, 10*time.Millisecond)
		if string(h.Job.Payload) != want[h.Job.ID] {
			t.Fatalf("job %s handed over with payload %.20q", h.Job.ID, h.Job.Payload)
		}
	}
	for _, id := range []string{a.Job.ID, b.Job.ID} {
		queuetest.WaitFor(t, func() bool { j, _ := s.Job(context.Background(), id); return j.State == queue.StateFailed })
		if _, err := s.Retry(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		h := queuetest.WaitHanded(t, clk, got, 10*time.Millisecond)
		if string(h.Job.Payload) != want[h.Job.ID] {
			t.Fatalf("job %s handed over again with payload %.20q", h.Job.ID, h.Job.Payload)
		}
	}
}

// A job's request round-trips in its record; a record written before
// requests were kept (version 1) still reads, with none.
func TestJobRecordKeepsTheRequest(t *testing.T) {
	t.Parallel()
	req := &queue.JobRequest{Method: "DELETE", Path: "/v1/customers/cus_1", Query: queue.Query{"expand[]": {"a", "b"}},
		Headers: map[string]string{"Stripe-Account": "acct_1"}}
	j := queue.Job{ID: "r", Tenant: "acme", State: queue.StateQueued, Request: req}
	got, inline, err := decodeJob(encodeJob(nil, j, []byte(`{}`)), "r")
	if err != nil || !reflect.DeepEqual(got.Request, req) || string(inline) != `{}` {
		t.Fatalf("round trip: %+v %q %v", got.Request, inline, err)
	}
	// Written by the build before this one: job "b", failed, payload {"n":1}.
	v1, _ := hex.DecodeString("01050461636d6500026b31040180a9a19a0d959aef3a0180a9a19a0d959aef3a0180a9a19a0d959aef3a0200000180a9a19a0dd59eac3b0180a9a19a0d95a3e93b14343032205061796d656e74205265717569726564a406c08db701060101077b226e223a317d")
	old, inline, err := decodeJob(v1, "b")
	if err != nil || old.State != queue.StateFailed || old.Tenant != "acme" || old.ResponseStatus != 402 ||
		old.LastError != "402 Payment Required" || !old.Prompt || old.Request != nil || string(inline) != `{"n":1}` {
		t.Fatalf("version 1 record: %+v %q %v", old, inline, err)
	}
}

func TestResponseRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range []*queue.Response{
		{Status: 201, Headers: map[string]string{"Content-Type": "application/json", "X-Request-Id": "req_1"}, Body: `{"sid":"SM1"}`},
		{Status: 402, Headers: map[string]string{}, BodyBase64: "/wD+", Truncated: true},
		{Status: 0, Headers: map[string]string{}},
	} {
		raw := encodeResponse(r)
		got, err := decodeResponse(raw)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip of %+v: %+v %v", r, got, err)
		}
		for n := range len(raw) {
			if _, err := decodeResponse(raw[:n]); err == nil {
				t.Fatalf("a response cut to %d of %d bytes was read", n, len(raw))
			}
		}
	}
}

// Any bytes decode to a job or an error, never a panic; a job decoded
// encodes to a record that decodes to it again.
func FuzzJobRecord(f *testing.F) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	for _, j := range []queue.Job{
		{Tenant: "acme", State: queue.StateQueued, EnqueuedAt: t0, DispatchAt: t0},
		{Tenant: "acme", State: queue.StateFailed, Request: &queue.JobRequest{Path: "/v1/x"}, Type: "t",
			Callback: &queue.JobCallback{URL: "https://app.example/hooks/x", On: []queue.JobState{queue.StateFailed, queue.StateExpired}}},
	} {
		f.Add(encodeJob(nil, j, nil))
		f.Add(encodeJob(nil, j, []byte(`{"n":1}`)))
	}
	f.Add([]byte(`{"tenant":"acme","state":"queued"}`))
	f.Add([]byte{jobRecordV4})
	f.Fuzz(func(t *testing.T, raw []byte) {
		j, inline, err := decodeJob(raw, "id")
		if err != nil || (len(raw) > 0 && raw[0] == '{') {
			return // JSON records are read, never written
		}
		again, inline2, err := decodeJob(encodeJob(nil, j, inline), "id")
		if err != nil || !sameJob(again, j) || string(inline2) != string(inline) {
			t.Fatalf("a decoded job does not round trip: %v\n got %+v\nwant %+v", err, again, j)
		}
		// A restart's reading agrees with the whole record's.
		w, err := decodeWaiting(raw)
		if err != nil || string(w.tenant) != j.Tenant || w.state != j.State || !w.dispatchAt.Equal(j.DispatchAt) ||
			!w.slot.Equal(j.EffectiveSlot()) || !w.deadline.Equal(j.Deadline) || !w.notBefore.Equal(j.NotBefore) || w.cost != j.Cost {
			t.Fatalf("decodeWaiting: %v %+v, the record holds %+v", err, w, j)
		}
	})
}

// A waiting job's value in the index of waiting jobs holds what a restart
// reads of its record; any bytes decode to a value or an error, never a
// panic, and a value decoded encodes to one that decodes to it again.
func FuzzWaitingValue(f *testing.F) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	for _, j := range []queue.Job{
		{Tenant: "acme", State: queue.StateQueued, DispatchAt: t0, Slot: t0.Add(time.Second)},
		{Tenant: "t+é@x", State: queue.StateScheduled, DispatchAt: t0, Slot: t0, Deadline: t0.Add(time.Hour), Cost: 7, NotBefore: t0},
		{Tenant: "b", State: queue.StateRetrying, DispatchAt: t0}, // an old record: no slot
	} {
		v := encodeWaiting(nil, j)
		w, current, err := decodeWaitingValue(v)
		record, _ := decodeWaiting(encodeJob(nil, j, nil))
		if err != nil || !current || string(w.tenant) != j.Tenant || !w.slot.Equal(record.slot) || !w.dispatchAt.Equal(j.DispatchAt) ||
			!w.deadline.Equal(j.Deadline) || w.cost != j.Cost || (w.state == queue.StateScheduled) != (j.State == queue.StateScheduled) ||
			w.notBefore.IsZero() != j.NotBefore.IsZero() {
			f.Fatalf("%+v: %v %v %+v", j, err, current, w)
		}
		f.Add(v)
	}
	f.Add([]byte("acme")) // an earlier version's value: the tenant alone
	f.Fuzz(func(t *testing.T, v []byte) {
		w, current, err := decodeWaitingValue(v)
		if err != nil || !current {
			return
		}
		st := queue.StateQueued
		if w.state == queue.StateScheduled {
			st = queue.StateScheduled
		}
		j := queue.Job{Tenant: string(w.tenant), State: st, Slot: w.slot, DispatchAt: w.dispatchAt, Deadline: w.deadline, Cost: w.cost, NotBefore: w.notBefore}
		again, current, err := decodeWaitingValue(encodeWaiting(nil, j))
		if err != nil || !current || string(again.tenant) != string(w.tenant) || !again.slot.Equal(w.slot) || !again.dispatchAt.Equal(w.dispatchAt) ||
			!again.deadline.Equal(w.deadline) || again.cost != w.cost || again.state != w.state || again.notBefore.IsZero() != w.notBefore.IsZero() {
			t.Fatalf("does not round trip: %v\n got %+v\nwant %+v", err, again, w)
		}
	})
}

// Any bytes decode to a tenant record or an error, never a panic; a record
// decoded encodes to one that decodes to it again (its bookings too).
func FuzzTenantRecord(f *testing.F) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	for _, r := range []rules.Record{
		{},
		{TAT: t0, LastAttemptAt: t0, LastAttemptCost: 3, Accepted: 7, Windows: map[string][]int64{"5/s": {1, 2}}},
		{TAT: t0, Booked: []rules.Booking{{Slot: t0.UnixNano(), Job: "a"}, {Slot: t0.Add(time.Second).UnixNano(), Cost: 2, Job: "b"}}},
		{TAT: t0, Behind: t0.Add(time.Second)},
		{TAT: t0, Sent: map[string][]int64{"5/s": {1, 2}, "1/h": {}}},
	} {
		f.Add(encodeTenant(nil, r))
	}
	f.Add([]byte{tenantRecordV3})
	f.Add([]byte{tenantRecordV4})
	f.Add([]byte(`{"tat":"2026-03-01T12:00:00Z"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := decodeTenant(raw)
		if err != nil || (len(raw) > 0 && raw[0] == '{') {
			return
		}
		again, err := decodeTenant(encodeTenant(nil, r))
		if err != nil {
			t.Fatalf("a record decoded from %x does not decode again: %v", raw, err)
		}
		want, _ := json.Marshal(r)
		got, _ := json.Marshal(again)
		if string(want) != string(got) {
			t.Fatalf("round trip of %x:\n got %s\nwant %s", raw, got, want)
		}
	})
}
