package domain

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
)

// refundsInline bounds the refunded originals Refunds keeps in its slice;
// one more moves them all into a map.
const refundsInline = 8

// Refunds is what was refunded of each refunded original, by the original's
// key (Account.Refunded): a small set, as read and written by key, in the
// order of nothing. Up to refundsInline originals it is a slice searched in
// order, one object of 40 bytes an original with one pointer each (the key's),
// where a Go map of one entry is a group of 8 slots, 310 bytes and 8 pointer
// slots the collector scans (issue 23: the audit keeps one Refunds for every
// account, each of at most one findable original); past it a map, so that an
// aggregate that keeps every original (RefundLimit 0) finds one in constant
// time. The zero value is empty. A copy of a Refunds shares its entries, as a
// copy of a map does, but not the originals added to either later.
type Refunds struct {
	small []refundEntry
	big   map[string]RefundedSum
}

type refundEntry struct {
	key string
	sum RefundedSum
}

// Len is the number of originals kept.
func (r *Refunds) Len() int {
	if r.big != nil {
		return len(r.big)
	}
	return len(r.small)
}

// Lookup is what was refunded of original key, and whether it is kept.
func (r *Refunds) Lookup(key string) (RefundedSum, bool) {
	if r.big != nil {
		s, ok := r.big[key]
		return s, ok
	}
	if i := r.find(key); i >= 0 {
		return r.small[i].sum, true
	}
	return RefundedSum{}, false
}

// Of is what was refunded of original key (zero when not kept).
func (r *Refunds) Of(key string) RefundedSum {
	s, _ := r.Lookup(key)
	return s
}

func (r *Refunds) find(key string) int {
	for i := range r.small {
		if r.small[i].key == key {
			return i
		}
	}
	return -1
}

// set keeps s as original key's: the one write of Refunds (Account's
// SetRefunded).
func (r *Refunds) set(key string, s RefundedSum) {
	if r.big != nil {
		r.big[key] = s
		return
	}
	if i := r.find(key); i >= 0 {
		r.small[i].sum = s
		return
	}
	if len(r.small) < refundsInline {
		r.small = append(r.small, refundEntry{key, s})
		return
	}
	r.big = make(map[string]RefundedSum, len(r.small)+1)
	for _, e := range r.small {
		r.big[e.key] = e.sum
	}
	r.big[key] = s
	r.small = nil
}

// Delete forgets original key; emptied, r holds no storage.
func (r *Refunds) Delete(key string) {
	if r.big != nil {
		delete(r.big, key)
		if len(r.big) == 0 {
			r.big = nil
		}
		return
	}
	if i := r.find(key); i >= 0 {
		r.small = slices.Delete(r.small, i, i+1)
	}
	if len(r.small) == 0 {
		r.small = nil
	}
}

// All yields each original kept and what was refunded of it, in no order
// to rely on.
func (r *Refunds) All() iter.Seq2[string, RefundedSum] {
	return func(yield func(string, RefundedSum) bool) {
		if r.big != nil {
			for k, s := range r.big {
				if !yield(k, s) {
					return
				}
			}
			return
		}
		for _, e := range r.small {
			if !yield(e.key, e.sum) {
				return
			}
		}
	}
}

// Map is a copy of r as a map (for tests and messages).
func (r *Refunds) Map() map[string]RefundedSum {
	return maps.Collect(r.All())
}

// String lists r as a map prints, in key order.
func (r Refunds) String() string {
	var b strings.Builder
	b.WriteString("map[")
	for i, k := range slices.Sorted(maps.Keys(r.Map())) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%+v", k, r.Of(k))
	}
	b.WriteByte(']')
	return b.String()
}
