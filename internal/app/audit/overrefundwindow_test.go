package audit

import (
	"fmt"
	"testing"
)

// TestOriginalWindowKeepsFoundFlags: a window keeps the last originalsKept
// originals put, each with its amount, refunded sum and whether it was
// found (a bit apart, shifted as the first kept is forgotten), and put
// again updates one in place, its found bit set and cleared.
func TestOriginalWindowKeepsFoundFlags(t *testing.T) {
	var w originalWindow
	sumOf := func(n int) originalSum {
		return originalSum{amount: int64(100 + n), refunded: int64(n), found: n%3 != 0}
	}
	const n = originalsKept + 5
	for i := range n {
		w.put(originalID(fmt.Sprintf("k%d", i), "account-a"), sumOf(i))
	}
	w.put(originalID("k10", "account-a"), originalSum{amount: 7, refunded: 3, found: false})
	w.put(originalID("k11", "account-a"), originalSum{amount: 8, refunded: 2, found: true})
	w.put(originalID("k12", "account-a"), originalSum{amount: 9, refunded: 1, found: true}) // not found, then found (a refund read before its original)
	if len(w.kept) != originalsKept {
		t.Fatalf("%d originals kept, want %d", len(w.kept), originalsKept)
	}
	for i := range n {
		at := w.find(originalID(fmt.Sprintf("k%d", i), "account-a"))
		want := sumOf(i)
		switch i {
		case 10:
			want = originalSum{amount: 7, refunded: 3, found: false}
		case 11:
			want = originalSum{amount: 8, refunded: 2, found: true}
		case 12:
			want = originalSum{amount: 9, refunded: 1, found: true}
		}
		switch {
		case i < n-originalsKept && at >= 0:
			t.Errorf("k%d kept, the first kept, past the window's %d", i, originalsKept)
		case i >= n-originalsKept && at < 0:
			t.Errorf("k%d not kept", i)
		case at >= 0 && w.sum(at) != want:
			t.Errorf("k%d: %+v, want %+v", i, w.sum(at), want)
		}
	}
}
