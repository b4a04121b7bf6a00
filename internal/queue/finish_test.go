package queue

import "testing"

// A notice wakes every watcher of its job and no other; a watcher that
// stopped is not woken, and a notice nobody waits for costs nothing.
func TestFinishesWakeTheirJobsWatchers(t *testing.T) {
	var f Finishes
	a1, stopA1 := f.Watch("a")
	a2, stopA2 := f.Watch("a")
	b, stopB := f.Watch("b")
	defer stopB()
	gone, stopGone := f.Watch("a")
	stopGone()
	f.Notify("nobody")
	f.Notify("a")
	for i, ch := range []<-chan struct{}{a1, a2} {
		select {
		case <-ch:
		default:
			t.Fatalf("watcher %d of a not woken", i+1)
		}
	}
	select {
	case <-b:
		t.Fatal("b's watcher woken by a's notice")
	case <-gone:
		t.Fatal("a stopped watcher woken")
	default:
	}
	stopA1() // after its notice: harmless
	stopA2()
	if len(f.watchers) != 1 {
		t.Fatalf("%d jobs watched, want only b", len(f.watchers))
	}
}
