package leaky

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// Window is a limit beside the rate: never more than N sends in any window
// of Length, written like a rate ("100/h", "1000/d"). It holds however the
// vendor counts (rolling windows, or fixed clock hours), which GCRA alone
// does not give: with burst N it lets almost 2N through in one window.
type Window struct {
	N      int
	Length time.Duration
	text   string
}

// ParseWindow parses N/DURATION with a whole N.
func ParseWindow(s string) (Window, error) {
	num, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if !ok || err != nil || n < 1 || n > 100_000 {
		return Window{}, fmt.Errorf("window %q: want N/DURATION with N a whole number from 1 to 100000, such as \"100/h\" or \"1000/d\"", s)
	}
	length, err := ParsePeriod(strings.TrimSpace(per))
	if err != nil {
		return Window{}, fmt.Errorf("window %q: %w", s, err)
	}
	return Window{N: n, Length: length, text: strings.TrimSpace(s)}, nil
}

// String is the window as written.
func (w Window) String() string {
	if w.text != "" {
		return w.text
	}
	return fmt.Sprintf("%d/%v", w.N, w.Length)
}

// Recent is a window's bookkeeping: the slots of the last N sends scheduled,
// oldest first (a cost-c job counts c times). Never more than N entries.
type Recent []time.Time

// Earliest is the first time at or after at when a job of cost fits in w:
// no window (t-Length, t] would then hold more than N sends.
func (r Recent) Earliest(w Window, at time.Time, cost int) time.Time {
	// After adding cost sends at t, the window ending at t holds them and
	// every entry after t-Length: all but the newest N-cost must be out.
	out := len(r) + cost - w.N // entries that must have left the window
	if out <= 0 {
		return at
	}
	if out > len(r) { // cost > N never fits; Policy.MaxCost refuses it first
		out = len(r)
	}
	if out == 0 {
		return at
	}
	return clock.Later(at, r[out-1].Add(w.Length))
}

// Add records cost sends at slot and keeps the newest N.
func (r Recent) Add(w Window, slot time.Time, cost int) Recent {
	for range cost {
		i, _ := slices.BinarySearchFunc(r, slot, func(a, b time.Time) int { return a.Compare(b) })
		r = slices.Insert(r, i, slot)
	}
	if len(r) > w.N {
		r = slices.Delete(r, 0, len(r)-w.N)
	}
	return r
}

// WindowSlot is the first time at or after at when a job of cost fits in
// every window of p (recent[i] belongs to p.Windows[i]). Each window only
// sets a lower bound, so the latest of them fits all.
func WindowSlot(recent []Recent, p Policy, at time.Time, cost int) time.Time {
	for i, w := range p.Windows {
		if i < len(recent) {
			at = recent[i].Earliest(w, at, cost)
		}
	}
	return at
}

// Decide admits and places one job of cost under the rate and every window
// of p, arriving at now while waiting jobs of the bucket wait (admitted and
// not yet sent). It returns the decision and the new state and windows; a
// refused job changes neither.
//
// Without windows this is AdmitCost. With windows a job can wait far longer
// than Capacity intervals for room in a window (it waits; it is not refused
// for it), so the queue is bounded by count: Capacity jobs waiting besides
// Burst going at once. Token mode (Capacity 0) never queues: a job a window
// would hold back is refused until the window has room.
func Decide(s State, recent []Recent, now time.Time, p Policy, cost, waiting int) (Decision, State, []Recent) {
	cost = max(cost, 1)
	if len(p.Windows) == 0 {
		d, st := AdmitCost(s, now, p, cost)
		return d, st, recent
	}
	var slot time.Time
	var st State
	if p.Capacity == 0 {
		d, next := AdmitCost(s, now, p, cost)
		if !d.Admitted {
			// The rate refuses it until then, and a full window may for
			// longer: it is admitted when both let it go at once.
			d.RetryAfter = WindowSlot(recent, p, now.Add(d.RetryAfter), cost).Sub(now)
			return d, s, recent
		}
		if ws := WindowSlot(recent, p, d.Slot, cost); ws.After(d.Slot) {
			return Decision{RetryAfter: ws.Sub(now)}, s, recent
		}
		slot, st = d.Slot, next
	} else {
		if waiting >= p.Capacity+p.Burst {
			return Decision{RetryAfter: p.Interval}, s, recent
		}
		slot, st = ReserveCost(s, now, p, cost)
		slot = WindowSlot(recent, p, slot, cost)
		st = Push(st, slot, p, cost)
	}
	return Decision{Admitted: true, Slot: slot, Delay: slot.Sub(now)}, st, Record(recent, p, slot, cost)
}

// Record returns the bookkeeping of p's windows with a send of cost at at
// counted (recent is left as it was; a window new to p starts empty).
func Record(recent []Recent, p Policy, at time.Time, cost int) []Recent {
	out := make([]Recent, len(p.Windows))
	for i, w := range p.Windows {
		var r Recent
		if i < len(recent) {
			r = slices.Clone(recent[i])
		}
		out[i] = r.Add(w, at, cost)
	}
	return out
}

// Written returns the bookkeeping of p's windows with a send of cost,
// counted at slot, counted at wrote instead when that is later: windows
// count real sends, and a send written after its slot (a slow connection,
// a timer that fired late) must not leave room in a window early. A
// window that no longer holds the slot (trimmed, or new to p) is left as
// it is. recent is left as it was.
func Written(recent []Recent, p Policy, slot, wrote time.Time, cost int) []Recent {
	if !wrote.After(slot) {
		return recent
	}
	out := make([]Recent, len(recent))
	for i, r := range recent {
		out[i] = r
		if i >= len(p.Windows) {
			continue
		}
		moved := 0
		r = slices.Clone(r)
		for k := len(r) - 1; k >= 0 && moved < max(cost, 1); k-- {
			if r[k].Equal(slot) {
				r = slices.Delete(r, k, k+1)
				moved++
			}
		}
		if moved > 0 {
			out[i] = r.Add(p.Windows[i], wrote, moved)
		}
	}
	return out
}

// EarliestAmong is the first time at or after at when a send of cost fits
// in w among sends (sorted, on either side of at): no window of Length
// that would hold it holds more than N. Unlike Recent.Earliest, which takes
// every send as before at, it counts a send after at only in the windows
// that hold both, so a send booked ahead bounds a job placed before it no
// more than it must. The earliest fit is at or a send's time plus Length:
// moving a send's window past it is the only way room comes.
func EarliestAmong(sends []time.Time, w Window, at time.Time, cost int) time.Time {
	cost = max(cost, 1)
	if cost > w.N { // never fits; Policy.MaxCost refuses it first
		if len(sends) == 0 {
			return at
		}
		return clock.Later(at, sends[len(sends)-1].Add(w.Length))
	}
	upTo := func(t time.Time) int { // sends at or before t
		i, _ := slices.BinarySearchFunc(sends, t, func(a, b time.Time) int {
			if a.After(b) {
				return 1
			}
			return -1
		})
		return i
	}
	fits := func(t time.Time) bool {
		// The windows (s-Length, s] holding t end in [t, t+Length); the
		// count rises only where one ends on a send.
		if upTo(t)-upTo(t.Add(-w.Length))+cost > w.N {
			return false
		}
		end := t.Add(w.Length)
		for k := upTo(t); k < len(sends) && sends[k].Before(end); k++ {
			if upTo(sends[k])-upTo(sends[k].Add(-w.Length))+cost > w.N {
				return false
			}
		}
		return true
	}
	k := upTo(at.Add(-w.Length)) // the first send whose window reaches past at
	for t := at; ; k++ {
		if fits(t) {
			return t
		}
		for k < len(sends) && !sends[k].Add(w.Length).After(t) {
			k++
		}
		if k == len(sends) {
			return t // unreachable: past every send's window, cost <= N fits
		}
		t = sends[k].Add(w.Length)
	}
}
