package domain

import "sync/atomic"

// interner keeps one copy of each of the few values that repeat across
// events (the metadata's command and producer, a claim's command, a
// payload's currency, reason, code and command): decoding a value it
// holds allocates nothing, where the read side's decoding of a long history
// allocated a copy of each for every event (issue 23). A value may sit in
// either of two slots (internSlots) chosen by a hash of its bytes, fixed
// across runs; a value whose two slots hold others is copied, as before, and
// replaces the first. Safe for concurrent use; its memory is bounded by its
// slots.
type interner [internSlots]atomic.Pointer[string]

// internSlots is the interner's slots; internLongest the longest value it
// keeps (a longer one is not one of the few).
const (
	internSlots   = 256
	internLongest = 64
)

// repeated interns the metadata's and the claims' commands and producers and
// the payloads' repeated members (repeatedMembers).
var repeated interner

// value is b as a string: the copy the interner holds when it holds one
// equal to b.
func (t *interner) value(b []byte) string {
	if len(b) > internLongest {
		return string(b)
	}
	h := fnv64(b)
	first, second := &t[h%internSlots], &t[(h>>32)%internSlots]
	for _, slot := range [2]*atomic.Pointer[string]{first, second} {
		if p := slot.Load(); p != nil && *p == string(b) {
			return *p
		}
	}
	s := string(b)
	if second.Load() == nil && first.Load() != nil {
		first = second
	}
	first.Store(&s)
	return s
}

// fnv64 is the 64-bit FNV-1a hash of b.
func fnv64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}
