package owner

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// P is recorded by the first process; one configured with another count
// is refused, at Start and at RecordPartitions, with an error that says
// what Redis records, where, and how to fix it.
func TestPartitionCountMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8, false)
	a := e.start("a", nil)
	if err := RecordPartitions(context.Background(), e.rdb, 8); err != nil {
		t.Fatalf("RecordPartitions with the recorded count: %v", err)
	}
	m, err := New(Options{Client: e.rdb, Partitions: 16, WorkerID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Start(context.Background())
	var pe *PartitionsError
	if !errors.As(err, &pe) || pe.Configured != 16 || pe.Recorded != 8 || pe.Key != partitionsKey {
		t.Fatalf("Start with 16 partitions on a Redis that records 8: %v", err)
	}
	for _, want := range []string{"configured with 16 partitions", "records 8", partitionsKey, "Configure 8 partitions", "delete that key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
	m.Stop() // never started: nothing to do
	if err := RecordPartitions(context.Background(), e.rdb, 16); !errors.As(err, &pe) {
		t.Fatalf("RecordPartitions with another count: %v", err)
	}
	// The refused worker did not join: a keeps the whole share.
	e.waitSteady("a to hold every partition", 5*testLease, a)
	if n := len(a.Owned()); n != 8 {
		t.Fatalf("a holds %d partitions, want all 8", n)
	}
}

// Options take their defaults from Lease, and contradictory timings are
// refused with what to change.
func TestOptions(t *testing.T) {
	t.Parallel()
	rdb := testClient(t)
	m, err := New(Options{Client: rdb})
	if err != nil {
		t.Fatal(err)
	}
	o := m.o
	if o.Partitions != PartitionsDefault || o.Lease != LeaseDefault || o.Renew != LeaseDefault/3 || o.Margin != time.Second ||
		o.Balance != time.Second || o.HeartbeatTTL != LeaseDefault || o.DrainTimeout != DrainTimeoutDefault || o.WorkerID == "" {
		t.Fatalf("defaults: %+v", o)
	}
	if m2, _ := New(Options{Client: rdb}); m2.ID() == m.ID() {
		t.Fatalf("two default worker ids alike: %s", m.ID())
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{}, "Client is required"},
		{Options{Client: rdb, Partitions: -1}, "Partitions -1"},
		{Options{Client: rdb, Lease: time.Millisecond}, "Lease 1ms"},
		{Options{Client: rdb, Margin: 6 * time.Second}, "Margin 6s"},
		{Options{Client: rdb, Renew: 4 * time.Second}, "less than Lease-Margin (4s)"},
		{Options{Client: rdb, Balance: 3 * time.Second}, "HeartbeatTTL at least twice"},
	} {
		if _, err := New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

// Shares sum to P, differ by at most one, and every worker computes the
// same ones from the same list.
func TestShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p    int
		live []string
		want []int
	}{
		{16, []string{"a", "b", "c"}, []int{6, 5, 5}},
		{16, []string{"a", "b", "c", "d"}, []int{4, 4, 4, 4}},
		{2, []string{"a", "b", "c"}, []int{1, 1, 0}},
		{7, []string{"x"}, []int{7}},
	} {
		for i, id := range tc.live {
			if got := shareOf(id, tc.live, tc.p); got != tc.want[i] {
				t.Errorf("P %d, live %v: %s's share %d, want %d", tc.p, tc.live, id, got, tc.want[i])
			}
		}
	}
	if got := shareOf("z", []string{"a"}, 4); got != 0 {
		t.Errorf("a worker not live has share %d", got)
	}
}
