package queuetest

import (
	"slices"
	"time"
)

// A tenant's windows in the model: what fits, where a job goes, and what
// a reload keeps of them. (Not model_windows.go: Go would build that name
// on Windows only.)

// windowFits reports whether cost more sends at t keep every window of
// the policy at N or fewer.
func (tn *mtenant) windowFits(t time.Time, cost int) bool {
	for _, w := range tn.wins {
		// Every window (x-L, x] holding t: x from t to t+L.
		xs := []time.Time{t}
		for _, e := range w.entries {
			if e.at.After(t) && e.at.Before(t.Add(w.spec.Length)) {
				xs = append(xs, e.at)
			}
		}
		for _, x := range xs {
			n := cost
			for _, e := range w.entries {
				if e.at.After(x.Add(-w.spec.Length)) && !e.at.After(x) {
					n += e.weight
				}
			}
			if n > w.spec.N {
				return false
			}
		}
	}
	return true
}

// earliestWindow is the first time at or after at when cost more sends fit
// every window.
func (tn *mtenant) earliestWindow(at time.Time, cost int) time.Time {
	if len(tn.wins) == 0 {
		return at
	}
	cands := []time.Time{at}
	for _, w := range tn.wins {
		for _, e := range w.entries {
			if c := e.at.Add(w.spec.Length); c.After(at) {
				cands = append(cands, c)
			}
		}
	}
	slices.SortFunc(cands, func(a, b time.Time) int { return a.Compare(b) })
	for _, c := range cands {
		if tn.windowFits(c, cost) {
			return c
		}
	}
	return cands[len(cands)-1] // not reached: past every entry it fits
}

// earliestAsIfBefore is the store's window rule as it is (see
// DefectWindowFuture): every recorded send counts as if it came before at.
func (tn *mtenant) earliestAsIfBefore(at time.Time, cost int) time.Time {
	for _, w := range tn.wins {
		var ts []time.Time
		for _, e := range w.entries {
			for range e.weight {
				ts = append(ts, e.at)
			}
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		if len(ts) > w.spec.N {
			ts = ts[len(ts)-w.spec.N:]
		}
		if out := min(len(ts)+cost-w.spec.N, len(ts)); out > 0 {
			at = laterOf(at, ts[out-1].Add(w.spec.Length))
		}
	}
	return at
}

func (tn *mtenant) recordWindows(at time.Time, cost int) {
	for _, w := range tn.wins {
		w.entries = append(w.entries, mentry{at: at, weight: cost})
	}
}
