package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// streamLocks serialises work on one stream inside this process. Entries are
// reference-counted so the map holds only streams in use; a released entry is
// kept in a pool for the next stream, so that taking a lock allocates nothing.
type streamLocks struct {
	mu    sync.Mutex
	locks map[string]*streamLock
	free  sync.Pool // of *streamLock, unused
}

type streamLock struct {
	ch     chan struct{} // a one-slot semaphore: holding the slot is holding the lock
	refs   int
	stream string
	unlock func() // frees the slot and releases the entry
}

func newStreamLocks() *streamLocks { return &streamLocks{locks: map[string]*streamLock{}} }

// lock takes the stream's lock, or gives up when ctx ends first.
func (l *streamLocks) lock(ctx context.Context, stream string) (unlock func(), err error) {
	l.mu.Lock()
	sl := l.locks[stream]
	if sl == nil {
		sl = l.entry(stream)
		l.locks[stream] = sl
	}
	sl.refs++
	l.mu.Unlock()
	select {
	case sl.ch <- struct{}{}:
		return sl.unlock, nil
	case <-ctx.Done():
		l.release(sl)
		return nil, ctx.Err()
	}
}

// tryLock takes the stream's lock when no one holds or waits for it, without
// waiting; ok is false otherwise.
func (l *streamLocks) tryLock(stream string) (unlock func(), ok bool) {
	l.mu.Lock()
	if l.locks[stream] != nil {
		l.mu.Unlock()
		return nil, false
	}
	sl := l.entry(stream)
	l.locks[stream] = sl
	sl.refs++
	l.mu.Unlock()
	sl.ch <- struct{}{} // free: the entry is new and ours alone
	return sl.unlock, true
}

// waiting is how many callers hold or wait for the stream's lock.
func (l *streamLocks) waiting(stream string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl := l.locks[stream]; sl != nil {
		return sl.refs
	}
	return 0
}

// entry returns an unused entry for stream, from the pool when it has one.
func (l *streamLocks) entry(stream string) *streamLock {
	if sl, ok := l.free.Get().(*streamLock); ok {
		sl.stream = stream
		return sl
	}
	sl := &streamLock{ch: make(chan struct{}, 1), stream: stream}
	sl.unlock = func() { <-sl.ch; l.release(sl) }
	return sl
}

// release drops one reference; the last one removes the entry and pools it (no
// one else can hold it then: every holder and waiter counts as a reference).
func (l *streamLocks) release(sl *streamLock) {
	l.mu.Lock()
	sl.refs--
	if sl.refs == 0 {
		delete(l.locks, sl.stream)
		sl.stream = ""
		l.free.Put(sl)
	}
	l.mu.Unlock()
}

// accountCache keeps recently used account aggregates, so that deciding a command
// and answering a duplicate cost a map lookup however long the stream is. An entry
// is only touched under its stream's lock. A stale entry (another instance wrote)
// is caught by the append's expected revision and refreshed by catching up.
//
// It is bounded by count and by memory: each entry's size is estimated
// (domain.Account.ApproxBytes) when it is added or has taken a command, and the
// least recently used entries are dropped while the sum is over the budget. An
// aggregate's own size is bounded too: its recent keys (Options.RecentKeys) and
// its active holds; its history lives in the store.
type accountCache struct {
	c *lru.Cache[string, *domain.Account]
	// evicted, when set, is given each aggregate the cache drops, after
	// forgetting it (Service.toResident).
	evicted func(stream string, acc *domain.Account)
	gauge   prometheus.Gauge // total, as a metric
	budget  int64
	mu      sync.Mutex
	sizes   map[string]int64
	total   int64
}

func newAccountCache(size int, budget int64, gauge prometheus.Gauge) *accountCache {
	ac := &accountCache{budget: budget, gauge: gauge, sizes: map[string]int64{}}
	ac.c = newLRU(size, func(stream string, acc *domain.Account) {
		ac.forget(stream)
		if ac.evicted != nil {
			ac.evicted(stream, acc)
		}
	})
	return ac
}

// newLRU is the one constructor of the service's caches: an LRU of size
// entries (New makes it positive, the one error lru.NewWithEvict returns),
// calling onEvict, when not nil, with each entry it evicts.
func newLRU[K comparable, V any](size int, onEvict func(K, V)) *lru.Cache[K, V] {
	c, err := lru.NewWithEvict(size, onEvict)
	if err != nil {
		panic(err)
	}
	return c
}

func (ac *accountCache) forget(stream string) {
	ac.mu.Lock()
	ac.total -= ac.sizes[stream]
	delete(ac.sizes, stream)
	ac.mu.Unlock()
}

// add caches acc and accounts for its size.
func (ac *accountCache) add(stream string, acc *domain.Account) {
	ac.c.Add(stream, acc)
	ac.resize(stream, acc)
}

// resize records the size of a cached aggregate (after it took a command) and
// drops the least recently used entries while the cache is over its budget.
func (ac *accountCache) resize(stream string, acc *domain.Account) {
	size := acc.ApproxBytes()
	ac.mu.Lock()
	if old, ok := ac.sizes[stream]; ok || ac.c.Contains(stream) {
		ac.total += size - old
		ac.sizes[stream] = size
	}
	over := ac.budget > 0 && ac.total > ac.budget
	ac.mu.Unlock()
	for over && ac.c.Len() > 1 {
		ac.c.RemoveOldest()
		ac.mu.Lock()
		over = ac.total > ac.budget
		ac.mu.Unlock()
	}
	ac.gauge.Set(float64(ac.bytes()))
}

func (ac *accountCache) bytes() int64 {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	return ac.total
}

// CachedBytes is the estimated heap of the cached account aggregates (what
// Options.CacheBytes bounds).
func (s *Service) CachedBytes() int64 { return s.accounts.bytes() }

// readPage bounds one read of a stream while catching up.
const readPage = 4096

// loadAccount returns the cached aggregate caught up to the store's head when
// refresh is set or it is not cached; otherwise the cached one as is. While
// appends are in flight on the stream, it is their pending state.
func (s *Service) loadAccount(ctx context.Context, stream, id string, refresh bool) (*domain.Account, error) {
	p, err := s.loadPending(ctx, stream, id, refresh)
	return p.acc, err
}

// pendingAccount is an account's state as a command is decided on it: the
// aggregate, and the pipeline chain (pipeline.go) of the appends in flight it
// includes, 0 when the state is durable.
type pendingAccount struct {
	acc   *domain.Account
	chain uint64
}

// loadPending is loadAccount with the pipeline chain of the state it returns.
func (s *Service) loadPending(ctx context.Context, stream, id string, refresh bool) (pendingAccount, error) {
	if s.loadHook != nil {
		s.loadHook(ctx, stream)
	}
	if acc, chain := s.pipes.pinned(stream); acc != nil {
		return pendingAccount{acc, chain}, nil // the pending state is ahead of the store
	}
	s.dropStale(stream)
	acc, ok := s.accounts.c.Get(stream)
	if ok && !refresh {
		return pendingAccount{acc: acc}, nil
	}
	var err error
	if ok {
		err = catchUp(ctx, s.store, stream, acc.Revision, foldInto(acc))
	} else {
		acc, err = s.loadCold(ctx, stream, id, refresh)
	}
	if err != nil {
		s.accounts.c.Remove(stream)
		return pendingAccount{}, err
	}
	s.accounts.add(stream, acc)
	s.snapshotIfDue(stream, acc)
	return pendingAccount{acc: acc}, nil
}

// foldInto folds events into acc.
func foldInto(acc *domain.Account) func(domain.StoredEvent) error {
	return func(ev domain.StoredEvent) error { return domain.EvolveAccount(acc, ev) }
}

// catchUp reads a stream forward from after+1 and hands each event to apply.
func catchUp(ctx context.Context, r eventstore.StreamReader, stream string, after int64, apply func(domain.StoredEvent) error) error {
	next := uint64(after + 1)
	for {
		evs, err := r.ReadStream(ctx, stream, next, eventstore.Forwards, readPage)
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, re := range evs {
			ev, err := toStored(re)
			if err != nil {
				return err
			}
			if err := apply(ev); err != nil {
				return err
			}
		}
		if len(evs) < readPage {
			return nil
		}
		next = evs[len(evs)-1].Revision + 1
	}
}

func toStored(re eventstore.RecordedEvent) (domain.StoredEvent, error) {
	m, err := domain.DecodeMetadata(re.Metadata)
	if err != nil {
		return domain.StoredEvent{}, fmt.Errorf("%s@%d: %w", re.Stream, re.Revision, err)
	}
	return domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m}, nil
}
