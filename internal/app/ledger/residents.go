package ledger

import (
	"context"
	"hash/maphash"
	"math"
	"runtime/trace"
	"slices"
	"sync"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Residents (issue 27): every account's state, compact (domain.Resident, about
// 200 bytes), kept apart from the bounded cache of full aggregates with their
// key records. An account leaves the cache as a resident (evicted, or warmed
// after a start once the cache is full) and comes back from one without a read
// of the store: a command on it decides at once. The two are disjoint: a
// resident is taken out when its account is loaded into the cache, and made
// again when the cache drops it.
//
// A resident is made only of an aggregate the store confirmed
// (domain.Account.Durable, which Compact checks: never the pending state of an
// append, even one that failed long before an eviction callback hands it
// over), under its stream's lock (a cache eviction whose stream is busy, or
// has appends in flight or stale, makes none: the next command loads the
// account cold, as before). It may be stale,
// like any cached aggregate another instance wrote past: the append's expected
// revision refuses a decision taken on it, and the command is decided again on
// the store's head.
//
// Only on a store that locates events by ID (residentsOn). Bounded by
// Options.ResidentAccounts: at the bound an arbitrary resident is
// dropped for a new one (its account loads cold on its next command).
//
// The table holds no pointer per resident, so that the garbage collector
// marks none of a million of them (issue 27: the skewed half-load p99 was
// GC marking): the compact states in pages of fixed-size records, the stream
// names and tails (domain.Resident) in pages of bytes (residentArena), and an
// index from the stream name's hash to the record (a map of integers,
// which the collector does not scan), a name whose hash the index holds for
// another resident's name in a side map (almost always empty; found there
// by name, so it needs no moving when the other one goes).
type residents struct {
	mu      sync.Mutex
	index   map[uint64]uint32 // name hash -> record
	collide map[string]uint32 // names whose hash index holds for another
	pages   [][]residentRec   // residentPageRecs records each
	free    []uint32          // records not in use
	arena   residentArena
	n       int
	limit   int
	// hash is the stream name's hash: maphash, seeded per process.
	hash func(stream string) uint64
	// print is the fingerprint of a key (domain.Resident): maphash, seeded per
	// process, so that no one can pick keys that collide.
	print func(key string) uint64
	// compacted, when set, is told how long each compaction held the
	// table's lock (ledger_resident_compaction_seconds).
	compacted func(time.Duration)
}

// residentRec is one resident in the table: no pointer.
type residentRec struct {
	res    domain.Resident
	block  uint32      // the name then the tail, in the arena (parts)
	name   uint16      // the name's length
	tail   uint32      // the tail's length
	origin originLabel // fromEviction or fromWarm
	used   bool
}

// residentPageRecs is how many records a page holds (about 600 KiB).
const residentPageRecs = 4096

// residentsOn is the bound on residents over store: limit where the store
// locates events by ID (eventstore.EventLocator: PostgreSQL, memory), whose
// unique event IDs refuse a key older than a resident's fingerprints; none
// elsewhere (KurrentDB, where such a key would be written again).
func residentsOn(store Store, limit int) int {
	if _, ok := store.(eventstore.EventLocator); !ok {
		return 0
	}
	return limit
}

// resident is an account's compact state, its tail and where it came from;
// ok is false for none.
type resident struct {
	domain.Resident
	tail   []byte
	origin residentOrigin
	ok     bool
}

// residentOrigin is where a resident came from, the label origin of
// ledger_resident_loads_total: made when the cache dropped the account, or
// when it was warmed after a start.
type residentOrigin string

const (
	fromEviction residentOrigin = "eviction"
	fromWarm     residentOrigin = "warm"
)

// originLabel is a residentOrigin in a record.
type originLabel uint8

var origins = [...]residentOrigin{fromEviction, fromWarm}

// labelOf is o's label: its index in origins, the one home of the mapping.
func labelOf(o residentOrigin) originLabel {
	i := slices.Index(origins[:], o)
	if i < 0 {
		panic("residents: an origin not in origins: " + string(o))
	}
	return originLabel(i)
}

func newResidents(limit int) *residents {
	seed, names := maphash.MakeSeed(), maphash.MakeSeed()
	return &residents{index: map[uint64]uint32{}, collide: map[string]uint32{}, limit: limit,
		hash:  func(stream string) uint64 { return maphash.String(names, stream) },
		print: func(key string) uint64 { return maphash.String(seed, key) }}
}

// rec is record i.
func (r *residents) rec(i uint32) *residentRec {
	return &r.pages[i/residentPageRecs][i%residentPageRecs]
}

// name is record i's stream name, in the arena.
func (r *residents) name(i uint32) []byte {
	name, _ := r.parts(r.rec(i))
	return name
}

// parts is rc's stream name and tail in the arena: its block holds the
// name, then the tail (the layout's one home).
func (r *residents) parts(rc *residentRec) (name, tail []byte) {
	all := r.arena.at(rc.block, rc.size())
	return all[:rc.name:rc.name], all[rc.name:]
}

// size is the bytes of rc's block in use: its name's and tail's.
func (rc *residentRec) size() int { return int(rc.name) + int(rc.tail) }

// find is stream's record, ok false when it has none.
func (r *residents) find(stream string, h uint64) (uint32, bool) {
	if i, ok := r.index[h]; ok && string(r.name(i)) == stream {
		return i, true
	}
	if len(r.collide) == 0 {
		return 0, false
	}
	i, ok := r.collide[stream]
	return i, ok
}

// take removes and returns stream's resident; ok is false when there is
// none.
func (r *residents) take(stream string) resident {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.find(stream, r.hash(stream))
	if !ok {
		return resident{}
	}
	rc := r.rec(i)
	res := resident{Resident: rc.res, origin: origins[rc.origin], ok: true}
	if _, tail := r.parts(rc); len(tail) > 0 {
		res.tail = slices.Clone(tail)
	}
	r.remove(stream, i)
	return res
}

// put keeps res as stream's resident, dropping an arbitrary other one at the
// bound, and reports whether it kept it; nothing when the bound is 0 or less, when stream's resident is at
// res's revision or above (a late eviction callback, which the cache calls
// after releasing its lock, may hand over an aggregate older than the
// resident made since, and replacing it would cost a refused append and a
// reload), when its name and tail are longer than a block of the arena, or
// when the arena has no offset left. In those last two cases stream's older
// resident is dropped all the same: a decision on it would be refused.
func (r *residents) put(stream string, res resident) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.limit <= 0 {
		return false
	}
	h := r.hash(stream)
	if i, ok := r.find(stream, h); ok {
		if r.rec(i).res.Revision() >= res.Revision() {
			return false
		}
		r.remove(stream, i) // older: gone even when res is not kept
	}
	size := len(stream) + len(res.tail)
	if len(stream) > math.MaxUint16 || size > residentBlockMax {
		return false
	}
	if r.n >= r.limit {
		r.dropOne()
	}
	block, ok := r.arena.alloc(size)
	if !ok {
		return false
	}
	i := r.newRec()
	rc := r.rec(i)
	*rc = residentRec{res: res.Resident, block: block, name: uint16(len(stream)), tail: uint32(len(res.tail)), origin: labelOf(res.origin), used: true}
	name, tail := r.parts(rc)
	copy(name, stream)
	copy(tail, res.tail)
	if _, taken := r.index[h]; taken {
		r.collide[stream] = i
	} else {
		r.index[h] = i
	}
	r.n++
	return true
}

// newRec is a record not in use, a new page's first when none is free.
func (r *residents) newRec() uint32 {
	if n := len(r.free); n > 0 {
		i := r.free[n-1]
		r.free = r.free[:n-1]
		return i
	}
	base := uint32(len(r.pages) * residentPageRecs)
	r.pages = append(r.pages, make([]residentRec, residentPageRecs))
	for j := residentPageRecs - 1; j > 0; j-- {
		r.free = append(r.free, base+uint32(j))
	}
	return base
}

// remove drops record i, stream's, from the table.
func (r *residents) remove(stream string, i uint32) {
	rc, h := r.rec(i), r.hash(stream)
	r.arena.release(rc.block, rc.size())
	*rc = residentRec{}
	r.free = append(r.free, i)
	r.n--
	if j, ok := r.index[h]; ok && j == i {
		delete(r.index, h)
	} else {
		delete(r.collide, stream)
	}
	if r.arena.sparse() {
		r.compact()
	}
}

// compact copies the blocks in use into a fresh arena and points their
// records at the copies: the freed blocks of each size, never merged, go
// (residentArena). Every block is a record's, under r.mu.
func (r *residents) compact() {
	defer trace.StartRegion(context.Background(), "residents.compact").End()
	if r.compacted != nil {
		defer func(t0 time.Time) { r.compacted(time.Since(t0)) }(time.Now())
	}
	var fresh residentArena
	for _, page := range r.pages {
		for j := range page {
			rc := &page[j]
			if !rc.used {
				continue
			}
			n := rc.size()
			block, ok := fresh.alloc(n)
			if !ok {
				panic("residents: compacting needs more offsets than the arena had")
			}
			copy(fresh.at(block, n), r.arena.at(rc.block, n))
			rc.block = block
		}
	}
	if fresh.live != r.arena.live {
		panic("residents: the arena's bytes in use are not its records'")
	}
	r.arena = fresh
}

// dropOne drops an arbitrary resident (the map's iteration order is random).
func (r *residents) dropOne() {
	for _, i := range r.index {
		r.remove(string(r.name(i)), i)
		return
	}
}

// has reports whether stream has a resident.
func (r *residents) has(stream string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.find(stream, r.hash(stream))
	return ok
}

// room reports whether a resident may be added without dropping another.
func (r *residents) room() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n < r.limit
}

// len is the number of residents.
func (r *residents) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// each calls f with every resident, under the table's lock (tests).
func (r *residents) each(f func(stream string, res resident)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, page := range r.pages {
		for j := range page {
			rc := &page[j]
			if !rc.used {
				continue
			}
			name, tail := r.parts(rc)
			f(string(name), resident{Resident: rc.res, tail: tail, origin: origins[rc.origin], ok: true})
		}
	}
}

// Residents is the number of accounts held in compact form, apart from the
// cache of aggregates.
func (s *Service) Residents() int { return s.residents.len() }

// loadCold is the aggregate of an account not cached: from its resident when
// it has one (caught up to the store's head when refresh is set), otherwise
// read from the store. The caller holds the stream's lock.
func (s *Service) loadCold(ctx context.Context, stream, id string, refresh bool) (*domain.Account, error) {
	res := s.residents.take(stream)
	if !res.ok {
		return s.cold.load(ctx, stream, id)
	}
	acc := s.newAccount(id)
	if err := res.Into(acc, res.tail); err != nil {
		s.log.Error("resident not taken", "stream", stream, "err", err)
		return s.cold.load(ctx, stream, id)
	}
	s.metrics.residentLoads.WithLabelValues(string(res.origin)).Inc()
	if !refresh {
		return acc, nil
	}
	return s.foldRest(ctx, stream, id, acc)
}

// toResident keeps acc, which the cache dropped, as stream's resident when
// no one holds or waits for the stream (else the cache's caller holds it: it
// may be mid-command) and Compact takes it (it is the store's state), and
// counts it made (by head) when the table kept it.
func (s *Service) toResident(stream string, acc *domain.Account) {
	unlock, ok := s.locks.tryLock(stream)
	if !ok {
		return
	}
	defer unlock()
	if !s.pipes.idle(stream) || s.accounts.c.Contains(stream) {
		return
	}
	res, tail, ok := domain.Compact(acc, s.residents.print)
	if ok && s.residents.put(stream, resident{res, tail, fromEviction, true}) {
		s.metrics.residentsMade.WithLabelValues(headLabel(acc.DecidedHead())).Inc()
	}
}
