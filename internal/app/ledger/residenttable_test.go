package ledger

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// TestResidentTableAgainstAMap: random puts, takes and lookups of residents
// of various name and tail lengths, with the table's name hash and with one
// under which most names collide, give what a map of the same residents
// gives: a take returns the resident put last (its revision and tail), a put
// at a lower revision than the resident's is ignored, the bound holds, and
// a resident the bound dropped is gone from every lookup. It fails when a
// collision answers for another name, when a freed record or block is
// handed out while in use, when a put replaces a newer resident, when a
// resident is dropped below the bound or a take misses one held (each shown
// failing so).
func TestResidentTableAgainstAMap(t *testing.T) {
	states := residentStates(t, 12)
	for name, hash := range map[string]func(string) uint64{"maphash": nil, "colliding": func(s string) uint64 { return uint64(len(s) % 3) }} {
		t.Run(name, func(t *testing.T) {
			const limit = 25
			r := newResidents(limit)
			if hash != nil {
				r.hash = hash
			}
			model := map[string]resident{}
			rng := rand.New(rand.NewPCG(1, 2))
			for step := range 3000 {
				stream := fmt.Sprintf("account-%s%d", strings.Repeat("x", rng.IntN(300)), rng.IntN(40))
				drops := 0 // residents the step may drop: one by a put at the bound
				switch rng.IntN(3) {
				case 0:
					res := states[rng.IntN(len(states))]
					if r.len() >= limit {
						drops = 1
					}
					r.put(stream, res)
					if old, ok := model[stream]; !ok || old.Revision() < res.Revision() {
						model[stream] = res
					}
				case 1:
					got, want := r.take(stream), model[stream]
					delete(model, stream)
					if got.ok != want.ok || got.ok && (got.Revision() != want.Revision() || !slices.Equal(got.tail, want.tail) || got.origin != want.origin) {
						t.Fatalf("step %d: took %s (%v) at %d, want (%v) at %d", step, stream, got.ok, got.Revision(), want.ok, want.Revision())
					}
				default:
					if r.has(stream) && !model[stream].ok {
						t.Fatalf("step %d: %s resident, never put", step, stream)
					}
				}
				checkResidentTable(t, r, model, limit, drops)
			}
		})
	}
}

// TestResidentTooLargeDropsTheOlder: a newer resident that is not kept
// (its name and tail longer than a block) takes out the older one: a take
// then returns none rather than the older state, whose decision the store
// would refuse. It fails when the size check returns before the older
// resident is removed (shown failing so).
func TestResidentTooLargeDropsTheOlder(t *testing.T) {
	states := residentStates(t, 3)
	r := newResidents(10)
	if !r.put("account-a", states[0]) {
		t.Fatal("first resident not kept")
	}
	big := states[2]
	big.tail = make([]byte, residentBlockMax)
	if r.put("account-a", big) {
		t.Fatal("a resident longer than a block kept")
	}
	if got := r.take("account-a"); got.ok || r.len() != 0 {
		t.Fatalf("took a resident at %d (%d held), want none: the older one is stale", got.Revision(), r.len())
	}
}

// TestResidentArenaStaysBounded: residents whose tails grow through
// several sizes and shrink back (accounts gaining and closing holds) leave
// the arena's pages within twice the bytes of the blocks in use and a page,
// those blocks within twice the names and tails, and every resident reads
// back its own tail. It fails when freed blocks of each size are kept and
// never merged, the pages the sum of each size's peak (shown failing so).
func TestResidentArenaStaysBounded(t *testing.T) {
	const n = 10_000
	res := residentStates(t, 1)[0]
	r := newResidents(n)
	for _, size := range []int{1, 40, 100, 200, 450, 900, 1} {
		for i := range n {
			stream := fmt.Sprintf("account-c%05d", i)
			r.take(stream)
			res.tail = bytes.Repeat([]byte{byte(i)}, size)
			r.put(stream, res)
		}
		if held, live := r.arena.held(), r.arena.live; held > 2*live+arenaPage {
			t.Fatalf("tails of %d bytes: %d bytes of pages held for %d in use", size, held, live)
		}
	}
	names := 0
	r.each(func(stream string, got resident) {
		names += len(stream) + len(got.tail)
		var i int
		if _, err := fmt.Sscanf(stream, "account-c%d", &i); err != nil || !bytes.Equal(got.tail, []byte{byte(i)}) {
			t.Fatalf("%s: tail %v, want [%d]", stream, got.tail, byte(i))
		}
	})
	if r.len() != n || r.arena.live > 2*names {
		t.Fatalf("%d residents, %d bytes of blocks for %d of names and tails", r.len(), r.arena.live, names)
	}
}

// checkResidentTable fails unless every resident of r is model's, r is
// within limit, its count is its records', and it dropped at most drops of
// model's residents; model loses those r dropped.
func checkResidentTable(t *testing.T, r *residents, model map[string]resident, limit, drops int) {
	t.Helper()
	seen := map[string]bool{}
	r.each(func(stream string, res resident) {
		want := model[stream]
		if seen[stream] || !want.ok || want.Revision() != res.Revision() || !slices.Equal(want.tail, res.tail) {
			t.Fatalf("%s resident at %d (twice: %v), want %+v", stream, res.Revision(), seen[stream], want)
		}
		seen[stream] = true
	})
	if r.len() != len(seen) || len(seen) > limit {
		t.Fatalf("%d residents counted, %d held, bound %d", r.len(), len(seen), limit)
	}
	for stream := range model {
		if !seen[stream] {
			if drops--; drops < 0 {
				t.Fatalf("%s dropped, the table not at its bound %d", stream, limit)
			}
			delete(model, stream) // dropped at the bound
		}
		if r.has(stream) != seen[stream] {
			t.Fatalf("%s: has %v, held %v", stream, r.has(stream), seen[stream])
		}
	}
}

// residentStates are the compact states of one account after each of n
// deposits, with metadata of a size growing with the revision (tails from
// none to several hundred bytes), alternately from eviction and warming.
func residentStates(t testing.TB, n int) []resident {
	t.Helper()
	var out []resident
	for i := range n {
		s := New(memory.New(), Options{Clock: clock})
		meta := "null"
		if i > 0 {
			var pairs []string
			for k := range i {
				pairs = append(pairs, fmt.Sprintf(`"m%d":%q`, k, strings.Repeat("m", 20*k)))
			}
			meta = "{" + strings.Join(pairs, ",") + "}"
		}
		mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"o","account_id":"a","currency":"EUR","metadata":%s}`, meta))
		for j := range i {
			mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d","account_id":"a","amount":1,"currency":"EUR"}`, j))
		}
		acc, _ := s.accounts.c.Peek(domain.AccountStream("a"))
		res, tail, ok := domain.Compact(acc, s.residents.print)
		if !ok {
			t.Fatalf("state %d not compacted", i)
		}
		out = append(out, resident{res, tail, origins[i%2], true})
		s.Close()
	}
	return out
}

// TestResidentRecordsHoldNoPointer: a resident's record holds no pointer,
// so that the garbage collector never marks the table's records (issue 27).
// It fails when a field with a pointer (a string, a slice, a map) is added
// to domain.Resident or to the record.
func TestResidentRecordsHoldNoPointer(t *testing.T) {
	if p := pointerIn(reflect.TypeFor[residentRec]()); p != "" {
		t.Fatalf("a resident's record holds a pointer: %s", p)
	}
}

// pointerIn names a field of typ that holds a pointer, "" when none does.
func pointerIn(typ reflect.Type) string {
	switch typ.Kind() {
	case reflect.Struct:
		for i := range typ.NumField() {
			if p := pointerIn(typ.Field(i).Type); p != "" {
				return typ.Name() + "." + typ.Field(i).Name + ": " + p
			}
		}
		return ""
	case reflect.Array:
		return pointerIn(typ.Elem())
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr, reflect.Float32, reflect.Float64:
		return ""
	default:
		return typ.String()
	}
}

// BenchmarkResidentsGC times a full garbage collection (runtime.GC) of a
// process holding 1,000,000 residents, each of an account opened without
// metadata, under names of its own: what the table costs every collection's
// marking. Compare builds alternated in one window (BENCHMARKS.md). Run with
//
//	go test ./internal/app/ledger -run '^$' -bench ResidentsGC -benchtime 20x -count 3
func BenchmarkResidentsGC(b *testing.B) {
	const n = 1_000_000
	r := manyResidents(b, n)
	runtime.GC()
	b.ResetTimer()
	for b.Loop() {
		runtime.GC()
	}
	b.StopTimer()
	if r.len() != n {
		b.Fatalf("%d residents, want %d", r.len(), n)
	}
	runtime.KeepAlive(r)
}

// BenchmarkResidentsCompact times one compaction of the residents' arena
// (residents.compact, under the table's lock: every resident lookup and
// eviction waits for it) holding 1,000,000 residents of accounts opened
// without metadata: the pause a compaction puts on commands at a million
// accounts. Run with
//
//	go test ./internal/app/ledger -run '^$' -bench ResidentsCompact -benchtime 20x -count 3
func BenchmarkResidentsCompact(b *testing.B) {
	const n = 1_000_000
	r := manyResidents(b, n)
	live := r.arena.live
	b.ResetTimer()
	for b.Loop() {
		r.mu.Lock()
		r.compact()
		r.mu.Unlock()
	}
	b.StopTimer()
	if r.len() != n || r.arena.live != live {
		b.Fatalf("%d residents and %d bytes of blocks, want %d and %d", r.len(), r.arena.live, n, live)
	}
}

// manyResidents is a table of n residents of accounts opened without
// metadata, under names of their own.
func manyResidents(b *testing.B, n int) *residents {
	res := residentStates(b, 1)[0]
	r := newResidents(n)
	for i := range n {
		r.put(fmt.Sprintf("account-c%07d", i), res)
	}
	return r
}
