package ledger

import (
	"context"
	"hash/maphash"
	"sync"

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
type residents struct {
	mu    sync.Mutex
	m     map[string]resident
	limit int
	// print is the fingerprint of a key (domain.Resident): maphash, seeded per
	// process, so that no one can pick keys that collide.
	print func(key string) uint64
}

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

// resident is an account's compact state and where it came from.
type resident struct {
	*domain.Resident
	origin residentOrigin
}

// residentOrigin is where a resident came from, the label origin of
// ledger_resident_loads_total: made when the cache dropped the account, or
// when it was warmed after a start.
type residentOrigin string

const (
	fromEviction residentOrigin = "eviction"
	fromWarm     residentOrigin = "warm"
)

func newResidents(limit int) *residents {
	seed := maphash.MakeSeed()
	return &residents{m: map[string]resident{}, limit: limit, print: func(key string) uint64 { return maphash.String(seed, key) }}
}

// take removes and returns stream's resident; its Resident is nil when there
// is none.
func (r *residents) take(stream string) resident {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.m[stream]
	if ok {
		delete(r.m, stream)
	}
	return res
}

// put keeps res as stream's resident, dropping an arbitrary other one at the
// bound; nothing when the bound is 0 or less, or when stream's resident is at
// res's revision or above: a late eviction callback (the cache calls it after
// releasing its lock) may hand over an aggregate older than the resident
// made since, and replacing it would cost a refused append and a reload.
func (r *residents) put(stream string, res resident) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.limit <= 0 {
		return
	}
	old, ok := r.m[stream]
	if ok && old.Revision() >= res.Revision() {
		return
	}
	if !ok && len(r.m) >= r.limit {
		for other := range r.m {
			delete(r.m, other)
			break
		}
	}
	r.m[stream] = res
}

// has reports whether stream has a resident.
func (r *residents) has(stream string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[stream]
	return ok
}

// room reports whether a resident may be added without dropping another.
func (r *residents) room() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m) < r.limit
}

// len is the number of residents.
func (r *residents) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// Residents is the number of accounts held in compact form, apart from the
// cache of aggregates.
func (s *Service) Residents() int { return s.residents.len() }

// loadCold is the aggregate of an account not cached: from its resident when
// it has one (caught up to the store's head when refresh is set), otherwise
// read from the store. The caller holds the stream's lock.
func (s *Service) loadCold(ctx context.Context, stream, id string, refresh bool) (*domain.Account, error) {
	res := s.residents.take(stream)
	if res.Resident == nil {
		return s.cold.load(ctx, stream, id)
	}
	s.metrics.residentLoads.WithLabelValues(string(res.origin)).Inc()
	acc := s.newAccount(id)
	res.Into(acc)
	if !refresh {
		return acc, nil
	}
	return s.foldRest(ctx, stream, id, acc)
}

// toResident keeps acc, which the cache dropped, as stream's resident when
// no one holds or waits for the stream (else the cache's caller holds it: it
// may be mid-command) and Compact takes it (it is the store's state).
func (s *Service) toResident(stream string, acc *domain.Account) {
	unlock, ok := s.locks.tryLock(stream)
	if !ok {
		return
	}
	defer unlock()
	if !s.pipes.idle(stream) || s.accounts.c.Contains(stream) {
		return
	}
	if res, ok := domain.Compact(acc, s.residents.print); ok {
		s.residents.put(stream, resident{res, fromEviction})
	}
}
