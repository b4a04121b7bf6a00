package redis

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// wantClaimed empties q, and fails unless its entries would be claimed in
// the order want says ("id@ms").
func wantClaimed(t *testing.T, q *schedule, want ...string) {
	t.Helper()
	var got []string
	for _, e := range q.popDue(time.Unix(1<<40, 0), 1<<20) {
		got = append(got, fmt.Sprintf("%s@%d", e.id, e.at.Sub(time.Unix(0, 0)).Milliseconds()))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// A tenant's entries due at one moment are claimed in their places'
// order, whatever order they were added in.
func TestScheduleTiesGoInPlaceOrder(t *testing.T) {
	at := time.Unix(10, 0)
	var q schedule
	for _, i := range []int{3, 0, 4, 1, 2} {
		q.add(&entry{at: at, place: time.Unix(1, 0).Add(time.Duration(i) * time.Millisecond), id: fmt.Sprint("j", i), tenant: "a"})
	}
	wantClaimed(t, &q, "j0@10000", "j1@10000", "j2@10000", "j3@10000", "j4@10000")
}

// A resume wakes a held tenant's jobs in their places' order: a job with
// no floor (admitted after a takeover) does not go before the floored
// jobs ahead of it (seed 184 of the Redis model: it did, and the
// model's expectation of which job goes at a gate's turn was thrown).
func TestScheduleWakeKeepsPlaces(t *testing.T) {
	base := time.Unix(0, 0)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	var q schedule
	// Looked at while held: their times are rechecks, not their places.
	q.add(&entry{at: ms(5000), place: ms(200), id: "late", tenant: "a", held: true})
	q.add(&entry{at: ms(5300), place: ms(100), id: "floored", tenant: "a", held: true})
	q.add(&entry{at: ms(5100), place: ms(150), id: "floored2", tenant: "a", held: true})
	q.add(&entry{at: ms(4000), place: ms(50), id: "other", tenant: "b", held: true})
	floors := map[string]time.Time{"floored": ms(3600), "floored2": ms(3600)}
	q.wake("a", ms(3500), func(id string) time.Time { return floors[id] })
	wantClaimed(t, &q, "floored@3600", "floored2@3600", "late@3600", "other@4000")
}

// A pushback's missed deadlines make those entries due at them (a lead
// after), as expiries the tenant's pace does not hold.
func TestScheduleExpire(t *testing.T) {
	base := time.Unix(0, 0)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	var q schedule
	q.add(&entry{at: ms(2000), place: ms(300), id: "x", tenant: "a"})
	q.add(&entry{at: ms(2100), place: ms(400), id: "y", tenant: "a"})
	q.expire(map[string]time.Time{"y": ms(470)}, 100*time.Millisecond)
	due := q.popDue(ms(570), 10)
	if len(due) != 1 || due[0].id != "y" || !due[0].expiry || !due[0].at.Equal(ms(570)) {
		t.Fatalf("due by 570ms: %+v, want y as an expiry at 570ms", due)
	}
}
