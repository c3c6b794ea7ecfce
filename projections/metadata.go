package projections

import (
	"maps"
	"slices"
	"strings"
)

// nulHeldAs is what the read models hold in place of U+0000: the Unicode
// replacement character.
const nulHeldAs = "\uFFFD"

// ReadModelMetadata is client metadata as the read models hold it (jsonb
// columns: accounts' and entries' metadata): m itself, unless a key or value
// holds U+0000, which jsonb refuses (SQLSTATE 22P05). The ledger refuses such
// metadata since 3de8c97, but a store written by an older build may hold it;
// there each U+0000 is held as U+FFFD, and of two keys that become one ("k"
// with U+0000, "k" with U+FFFD) the first in byte order keeps its value. The
// event store keeps the bytes as written (events out, query.command,
// query.transaction answer them). The one home of the rule: the projections
// (live and rebuilt) and the audit's comparison call it.
func ReadModelMetadata(m map[string]string) map[string]string {
	if !holdsNUL(m) {
		return m
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		held := strings.ReplaceAll(k, "\x00", nulHeldAs)
		if _, taken := out[held]; !taken {
			out[held] = strings.ReplaceAll(m[k], "\x00", nulHeldAs)
		}
	}
	return out
}

func holdsNUL(m map[string]string) bool {
	for k, v := range m {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return true
		}
	}
	return false
}
