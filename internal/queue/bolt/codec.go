package bolt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// A job's record in the jobs bucket is binary: a version byte, then its
// fields in a fixed order (strings as uvarint length and bytes, integers as
// varints, times as a presence byte then varint seconds and uvarint
// nanoseconds, so that any time.Time, zero or not, comes back Equal), and
// last the payload if it is small (inlinePayload): a large one is written
// once in bucketPayloads instead of with every change of the record.
// Records written by earlier versions are JSON objects, their payloads in
// bucketPayloads, and are still read.
//
// Binary because a record is written at every admission and every outcome:
// JSON was a tenth of the CPU of an admission.
//
// Version 2 adds the job's request (queue.JobRequest as JSON, "" for none:
// rare, and small) after Prompt; version 1 records are still read. The
// answer kept of the latest attempt is not in the record, which every
// change rewrites: it is written once per answer in bucketResponses.
//
// Version 3 adds the job's type (Job.Type, for a Go handler; "" for none)
// after the request; versions 1 and 2 are still read, with none.
//
// Version 4 adds the job's callback (queue.JobCallback as JSON, "" for
// none) after the type; earlier versions are still read, with none. The
// callback's state, which changes after the job's end, is not in the
// record: it is in bucketCallbacks.
const (
	jobRecordV1 = 1
	jobRecordV2 = 2
	jobRecordV3 = 3
	jobRecordV4 = 4
	jobRecordV5 = 5 // with NotBefore
)

// inlinePayload is the largest payload kept in the job's record: an
// admission then writes one record instead of two, in one tree.
const inlinePayload = 1024

var errBadRecord = errors.New("job record: truncated or of an unknown version")

// jobStates numbers the states in a record (a byte instead of the name).
var jobStates = []queue.JobState{"", queue.StateQueued, queue.StateDispatching, queue.StateRetrying,
	queue.StateSucceeded, queue.StateFailed, queue.StateCancelled, queue.StateExpired, queue.StateScheduled}

func stateCode(st queue.JobState) (byte, bool) {
	for i, s := range jobStates {
		if s == st {
			return byte(i), true
		}
	}
	return 0, false
}

// encodeJob appends j's record (without ID: the key holds it) to b, with
// payload inline (nil: none there; it is in bucketPayloads).
func encodeJob(b []byte, j queue.Job, payload []byte) []byte {
	code, ok := stateCode(j.State)
	b = append(b, jobRecordV5, code)
	b = appendString(b, j.Tenant)
	if !ok {
		b = appendString(b, string(j.State)) // never written today; kept readable
	} else {
		b = appendString(b, "")
	}
	b = appendString(b, j.IdempotencyKey)
	b = binary.AppendVarint(b, int64(j.Attempts))
	b = appendTime(b, j.EnqueuedAt)
	b = appendTime(b, j.DispatchAt)
	b = appendTime(b, j.Slot)
	b = binary.AppendVarint(b, int64(j.Failures))
	b = binary.AppendVarint(b, int64(j.Cost))
	b = appendTime(b, j.Deadline)
	b = appendTime(b, j.SentAt)
	b = appendTime(b, j.FinishedAt)
	b = appendString(b, j.LastError)
	b = binary.AppendVarint(b, int64(j.ResponseStatus))
	b = binary.AppendVarint(b, int64(j.AdmitDelay))
	b = binary.AppendVarint(b, int64(j.AdmitDepth))
	prompt := byte(0)
	if j.Prompt {
		prompt = 1
	}
	b = append(b, prompt)
	b = appendRequest(b, j.Request)
	b = appendString(b, j.Type)
	b = appendCallback(b, j.Callback)
	b = appendTime(b, j.NotBefore)
	if payload == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	return appendString(b, string(payload))
}

// decodeJob reads a record written by encodeJob, or an older JSON one. The
// job comes without its payload; inline is the payload in the record (a
// part of raw), nil if it is in bucketPayloads.
func decodeJob(raw []byte, id string) (j queue.Job, inline []byte, err error) {
	if len(raw) > 0 && raw[0] == '{' {
		err := json.Unmarshal(raw, &j)
		j.Payload = nil
		return j, nil, err
	}
	d := decoder{b: raw}
	version := d.byte()
	if version < jobRecordV1 || version > jobRecordV5 {
		return j, nil, errBadRecord
	}
	code := d.byte()
	j.ID = id
	j.Tenant = d.string()
	if name := d.string(); name != "" {
		j.State = queue.JobState(name)
	} else if int(code) < len(jobStates) {
		j.State = jobStates[code]
	}
	j.IdempotencyKey = d.string()
	j.Attempts = int(d.varint())
	j.EnqueuedAt = d.time()
	j.DispatchAt = d.time()
	j.Slot = d.time()
	j.Failures = int(d.varint())
	j.Cost = int(d.varint())
	j.Deadline = d.time()
	j.SentAt = d.time()
	j.FinishedAt = d.time()
	j.LastError = d.string()
	j.ResponseStatus = int(d.varint())
	j.AdmitDelay = time.Duration(d.varint())
	j.AdmitDepth = int(d.varint())
	j.Prompt = d.byte() == 1
	if version >= jobRecordV2 {
		if j.Request, err = decodeRequest(d.bytes()); err != nil {
			return queue.Job{}, nil, err
		}
	}
	if version >= jobRecordV3 {
		j.Type = d.string()
	}
	if version >= jobRecordV4 {
		if j.Callback, err = decodeCallback(d.bytes()); err != nil {
			return queue.Job{}, nil, err
		}
	}
	if version >= jobRecordV5 {
		j.NotBefore = d.time()
	}
	if d.byte() == 1 {
		inline = d.bytes()
		if inline == nil {
			inline = []byte{}
		}
	}
	if d.bad || len(d.b) != 0 {
		return queue.Job{}, nil, errBadRecord
	}
	return j, inline, nil
}

// A waiting job's value in the index of waiting jobs is what a restart
// needs of it, so that a restart reads that index alone, not every job's
// record: a version byte (waitingV1), its slot, dispatch time and deadline
// (Unix nanoseconds, big endian; noDeadline: none), its cost, flags
// (scheduled, has a not_before), then its tenant's name. Earlier versions
// wrote the tenant's name alone (a name never starts with waitingV1: it is
// printable); such a job's place is read from its record.
const waitingV1 = 1

const (
	waitingScheduled = 1 << iota
	waitingNotBefore
)

// encodeWaiting appends j's value in the index of waiting jobs to b.
func encodeWaiting(b []byte, j queue.Job) []byte {
	deadline := int64(noDeadline)
	if !j.Deadline.IsZero() {
		deadline = nanos(j.Deadline)
	}
	var flags byte
	if j.State == queue.StateScheduled {
		flags |= waitingScheduled
	}
	if !j.NotBefore.IsZero() {
		flags |= waitingNotBefore
	}
	b = append(b, waitingV1)
	b = binary.BigEndian.AppendUint64(b, uint64(nanos(j.EffectiveSlot())))
	b = binary.BigEndian.AppendUint64(b, uint64(nanos(j.DispatchAt)))
	b = binary.BigEndian.AppendUint64(b, uint64(deadline))
	b = binary.AppendUvarint(b, uint64(max(j.Cost, 0)))
	b = append(b, flags)
	return append(b, j.Tenant...)
}

// decodeWaitingValue reads a value of encodeWaiting; ok is false for a
// value of an earlier version (the tenant alone), whose job's place is in
// its record.
func decodeWaitingValue(v []byte) (w waitingFields, ok bool, err error) {
	if len(v) == 0 || v[0] != waitingV1 {
		return w, false, nil
	}
	d := decoder{b: v[1:]}
	slot, dispatchAt, deadline := d.int64(), d.int64(), d.int64()
	cost := d.uvarint()
	flags := d.byte()
	// nanos never gives math.MinInt64 (noDeadline) for a time.
	if d.bad || len(d.b) == 0 || cost > math.MaxInt32 || slot == math.MinInt64 || dispatchAt == math.MinInt64 {
		return w, true, errBadRecord
	}
	w = waitingFields{tenant: d.b, slot: fromNanos(slot), dispatchAt: fromNanos(dispatchAt), cost: int(cost), state: queue.StateQueued}
	if deadline != noDeadline {
		w.deadline = fromNanos(deadline)
	}
	if flags&waitingScheduled != 0 {
		w.state = queue.StateScheduled
	}
	if flags&waitingNotBefore != 0 {
		w.notBefore = w.slot // only its presence is read
	}
	return w, true, nil
}

// waitingFields are what a restart reads of a waiting job: its place, not
// its content.
type waitingFields struct {
	tenant     []byte // a part of the record
	state      queue.JobState
	dispatchAt time.Time
	slot       time.Time // Job.EffectiveSlot
	deadline   time.Time
	notBefore  time.Time
	cost       int
}

// decodeWaiting reads what waitingFields hold of a record written by
// encodeJob, skipping the rest without copying it: a restart reads the
// record of each waiting job an earlier build indexed by tenant alone, all
// of them after an upgrade, and decodeJob's strings and JSON would be most
// of its time and memory. An older JSON record is read by decodeJob.
func decodeWaiting(raw []byte) (waitingFields, error) {
	if len(raw) > 0 && raw[0] == '{' {
		j, _, err := decodeJob(raw, "")
		return waitingFields{tenant: []byte(j.Tenant), state: j.State, dispatchAt: j.DispatchAt, slot: j.EffectiveSlot(),
			deadline: j.Deadline, notBefore: j.NotBefore, cost: j.Cost}, err
	}
	var w waitingFields
	d := decoder{b: raw}
	version := d.byte()
	if version < jobRecordV1 || version > jobRecordV5 {
		return w, errBadRecord
	}
	code := d.byte()
	w.tenant = d.bytes()
	if name := d.bytes(); len(name) > 0 {
		w.state = queue.JobState(name)
	} else if int(code) < len(jobStates) {
		w.state = jobStates[code]
	}
	d.bytes()  // idempotency key
	d.varint() // attempts
	d.time()   // enqueued
	w.dispatchAt = d.time()
	w.slot = d.time()
	d.varint() // failures
	w.cost = int(d.varint())
	w.deadline = d.time()
	d.time()   // sent
	d.time()   // finished
	d.bytes()  // last error
	d.varint() // response status
	d.varint() // admit delay
	d.varint() // admit depth
	d.byte()   // prompt
	if version >= jobRecordV2 {
		d.bytes() // request
	}
	if version >= jobRecordV3 {
		d.bytes() // type
	}
	if version >= jobRecordV4 {
		d.bytes() // callback
	}
	if version >= jobRecordV5 {
		w.notBefore = d.time()
	}
	if d.byte() == 1 {
		d.bytes() // payload
	}
	if d.bad || len(d.b) != 0 {
		return waitingFields{}, errBadRecord
	}
	if w.slot.IsZero() {
		w.slot = w.dispatchAt
	}
	return w, nil
}

// appendRequest appends a job's request as a string: its JSON, or ""
// for none.
func appendRequest(b []byte, r *queue.JobRequest) []byte {
	if r == nil {
		return append(b, 0)
	}
	raw, err := json.Marshal(r)
	if err != nil { // maps of strings: cannot fail
		panic(err)
	}
	return appendString(b, string(raw))
}

func decodeRequest(raw []byte) (*queue.JobRequest, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	r := new(queue.JobRequest)
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, errBadRecord
	}
	return r, nil
}

// appendCallback appends a job's callback as a string: its JSON, or ""
// for none.
func appendCallback(b []byte, c *queue.JobCallback) []byte {
	if c == nil {
		return append(b, 0)
	}
	raw, err := json.Marshal(c)
	if err != nil { // strings: cannot fail
		panic(err)
	}
	return appendString(b, string(raw))
}

func decodeCallback(raw []byte) (*queue.JobCallback, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	c := new(queue.JobCallback)
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, errBadRecord
	}
	return c, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// decoder reads a record; bad is set (and zero values returned) once it
// runs past the end.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.bad = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) varint() int64 { return readVarint(d, binary.Varint) }

func (d *decoder) uvarint() uint64 { return readVarint(d, binary.Uvarint) }

// readVarint reads a number with read (binary.Varint or binary.Uvarint).
func readVarint[T int64 | uint64](d *decoder, read func([]byte) (T, int)) T {
	v, n := read(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }

// int64 reads 8 bytes, big endian.
func (d *decoder) int64() int64 {
	if len(d.b) < 8 {
		d.bad = true
		return 0
	}
	v := int64(binary.BigEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

// bytes reads a string's bytes (a part of the record, not a copy).
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.b)) {
		d.bad = true
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *decoder) time() time.Time {
	if d.byte() == 0 {
		return time.Time{}
	}
	sec := d.varint()
	nsec := d.uvarint()
	if d.bad || nsec >= 1e9 {
		d.bad = true
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec))
}

// A tenant's record in the tenants bucket is binary too (it is written with
// every admission): a version byte, then TenantRecord's fields in order.
// Version 2 adds LastAttemptCost at the end, version 3 the bookings after
// it, version 4 Behind after them, version 5 the windows' sends made
// (Sent) after that. Records written by earlier versions (1 to 4, or JSON
// objects) are still read.
const (
	tenantRecordV1 = 1
	tenantRecordV2 = 2
	tenantRecordV3 = 3
	tenantRecordV4 = 4
	tenantRecordV5 = 5
)

func encodeTenant(b []byte, r rules.Record) []byte {
	b = append(b, tenantRecordV5)
	b = appendTime(b, r.TAT)
	b = binary.AppendVarint(b, int64(r.Pause.Shift))
	b = appendTime(b, r.Pause.Until)
	b = appendTime(b, r.Pause.Held)
	b = appendTime(b, r.LastAttemptAt)
	for _, n := range []int64{r.Accepted, r.Rejected, r.Delivered, r.Failed, r.Cancelled, r.Expired} {
		b = binary.AppendVarint(b, n)
	}
	b = appendWindows(b, r.Windows)
	b = binary.AppendUvarint(b, uint64(max(r.LastAttemptCost, 0)))
	b = binary.AppendUvarint(b, uint64(len(r.Booked)))
	for _, bk := range r.Booked {
		b = binary.AppendVarint(b, bk.Slot)
		b = binary.AppendUvarint(b, uint64(max(bk.Cost, 0)))
		b = appendString(b, bk.Job)
	}
	b = appendTime(b, r.Behind)
	return appendWindows(b, r.Sent)
}

// appendWindows appends windows' lists: their count, then each one's name,
// length and times, by name.
func appendWindows(b []byte, m map[string][]int64) []byte {
	b = binary.AppendUvarint(b, uint64(len(m)))
	if len(m) == 0 {
		return b // most tenants have no windows: nothing to sort (which allocates)
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(m[name])))
		for _, ns := range m[name] {
			b = binary.AppendVarint(b, ns)
		}
	}
	return b
}

// windows reads what appendWindows wrote (nil for none).
func (d *decoder) windows() map[string][]int64 {
	n := d.uvarint()
	if d.bad || n == 0 {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.bad = true
		return nil
	}
	m := make(map[string][]int64, n)
	for range n {
		name := d.string()
		k := d.uvarint()
		if d.bad || k > uint64(len(d.b)) {
			d.bad = true
			return nil
		}
		ns := make([]int64, k)
		for i := range ns {
			ns[i] = d.varint()
		}
		m[name] = ns
	}
	return m
}

func decodeTenant(raw []byte) (rules.Record, error) {
	var r rules.Record
	if len(raw) > 0 && raw[0] == '{' {
		err := json.Unmarshal(raw, &r)
		return r, err
	}
	d := decoder{b: raw}
	version := d.byte()
	if version < tenantRecordV1 || version > tenantRecordV5 {
		return r, errBadRecord
	}
	r.TAT = d.time()
	r.Pause.Shift = time.Duration(d.varint())
	r.Pause.Until = d.time()
	r.Pause.Held = d.time()
	r.LastAttemptAt = d.time()
	for _, n := range []*int64{&r.Accepted, &r.Rejected, &r.Delivered, &r.Failed, &r.Cancelled, &r.Expired} {
		*n = d.varint()
	}
	r.Windows = d.windows()
	if version >= tenantRecordV2 {
		r.LastAttemptCost = int(min(d.uvarint(), math.MaxInt32))
	}
	if version >= tenantRecordV3 {
		n := d.uvarint()
		if d.bad || n > uint64(len(d.b)) {
			return rules.Record{}, errBadRecord
		}
		for range n {
			bk := rules.Booking{Slot: d.varint(), Cost: int(min(d.uvarint(), math.MaxInt32))}
			bk.Job = d.string()
			r.Booked = append(r.Booked, bk)
		}
	}
	if version >= tenantRecordV4 {
		r.Behind = d.time()
	}
	if version >= tenantRecordV5 {
		r.Sent = d.windows()
	}
	if d.bad || len(d.b) != 0 {
		return rules.Record{}, errBadRecord
	}
	return r, nil
}

// The answer kept of a job's latest attempt, in bucketResponses, is binary
// too: a version byte, the status, truncated, the headers (count, then
// name and value each, by name) and the body as text and as base64 (one
// of them empty).
const responseRecordV1 = 1

func encodeResponse(r *queue.Response) []byte {
	b := make([]byte, 0, 32+len(r.Body)+len(r.BodyBase64))
	b = append(b, responseRecordV1)
	b = binary.AppendUvarint(b, uint64(max(r.Status, 0)))
	truncated := byte(0)
	if r.Truncated {
		truncated = 1
	}
	b = append(b, truncated)
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
		b = appendString(b, name)
		b = appendString(b, r.Headers[name])
	}
	b = appendString(b, r.Body)
	return appendString(b, r.BodyBase64)
}

func decodeResponse(raw []byte) (*queue.Response, error) {
	d := decoder{b: raw}
	if d.byte() != responseRecordV1 {
		return nil, errBadRecord
	}
	r := &queue.Response{Status: int(min(d.uvarint(), math.MaxInt32)), Truncated: d.byte() == 1}
	n := d.uvarint()
	if d.bad || n > uint64(len(d.b)) {
		return nil, errBadRecord
	}
	r.Headers = make(map[string]string, n)
	for range n {
		name := d.string()
		r.Headers[name] = d.string()
	}
	r.Body = d.string()
	r.BodyBase64 = d.string()
	if d.bad || len(d.b) != 0 {
		return nil, errBadRecord
	}
	return r, nil
}
