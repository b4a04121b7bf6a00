package bolt

import (
	"bytes"
	"cmp"
	"slices"
	"testing"
)

// The schedule's heap hands entries back by time, then id.
func TestSlimHeapOrder(t *testing.T) {
	t.Parallel()
	var h slimHeap
	var want []slimEntry
	for i := range 500 {
		e := slimEntry{at: int64((i * 7919) % 97), id: jobKey{byte(i % 5), byte(i)}}
		h.push(e)
		want = append(want, e)
	}
	slices.SortFunc(want, func(a, b slimEntry) int {
		return cmp.Or(cmp.Compare(a.at, b.at), bytes.Compare(a.id[:], b.id[:]))
	})
	for i, w := range want {
		if i == 250 { // half way, as compact does
			h.init()
		}
		if got := h.pop(); got != w {
			t.Fatalf("pop %d: %+v, want %+v", i, got, w)
		}
	}
	if len(h) != 0 {
		t.Fatalf("%d left", len(h))
	}
}
