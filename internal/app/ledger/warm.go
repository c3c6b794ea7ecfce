package ledger

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Warming (issue 27). A ledger restarted over a million accounts finds every
// one of them cold: its first command waits for a read of the store. So, when
// Options.WarmAccounts asks for it and the store can list its streams and read
// many of them at once (eventstore.StreamLister and ColdReader: PostgreSQL,
// memory), the accounts the store holds are loaded into the aggregate cache in
// the background, warmPage at a time, one page in flight: into the cache until
// it is nine tenths full by count or by bytes (the rest is left to the
// accounts commands touch, so warming never evicts them), then as residents
// (residents.go) until they are at their bound, or WarmAccounts were loaded.
//
// It never blocks a command: a command on an account not yet warm loads it as
// before, and warming skips every account a command holds or waits for, has
// appends in flight on, or has already cached. A warmed aggregate is what a
// cold load gives at the time of its read; when a command of this instance or
// another one wrote the account after that read, the aggregate is stale, like
// a cache another instance left behind: the append's expected revision refuses
// a decision taken on it, and the command is decided again on the store's head.
type warmer struct {
	s      *Service
	list   eventstore.StreamLister
	read   eventstore.ColdReader
	limit  int
	cancel context.CancelFunc
	done   chan struct{}
	// warmed and skipped count accounts: loaded into the cache, and passed
	// over (busy, cached, or unreadable).
	warmed, skipped atomic.Int64
}

// warmPage is the accounts one page of warming lists and reads: one
// ColdReader request.
const warmPage = maxColdBatch

// warmProgressEvery spaces warming's progress lines.
const warmProgressEvery = 10 * time.Second

// startWarming starts warming when opts ask for it and the store can: nil
// otherwise.
func startWarming(s *Service, store Store, limit int) *warmer {
	list, lists := store.(eventstore.StreamLister)
	read, reads := store.(eventstore.ColdReader)
	if limit <= 0 {
		return nil
	}
	if !lists || !reads {
		s.log.Info("accounts not warmed: the event store cannot list and read many streams at once")
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &warmer{s: s, list: list, read: read, limit: limit, cancel: cancel, done: make(chan struct{})}
	go w.run(ctx)
	return w
}

// stop ends warming and waits for it (nil: nothing to stop).
func (w *warmer) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// run walks the store's account streams a page at a time while the cache has
// room.
func (w *warmer) run(ctx context.Context) {
	defer close(w.done)
	start, last := time.Now(), time.Now()
	after := ""
	for w.room() {
		streams, err := w.list.ListStreams(ctx, domain.AccountStreamPrefix, after, warmPage)
		if err == nil && len(streams) > 0 {
			err = w.page(ctx, streams)
		}
		if err != nil {
			if ctx.Err() == nil {
				w.s.log.Warn("warming accounts stopped: a read failed (commands load accounts as they need them)", "warmed", w.warmed.Load(), "err", err)
			}
			return
		}
		if len(streams) < warmPage {
			break
		}
		after = streams[len(streams)-1]
		if time.Since(last) >= warmProgressEvery {
			last = time.Now()
			w.s.log.Info("warming accounts", "warmed", w.warmed.Load(), "skipped", w.skipped.Load(), "cached_bytes", w.s.accounts.bytes(), "residents", w.s.residents.len())
		}
	}
	w.s.log.Info("accounts warmed", "warmed", w.warmed.Load(), "skipped", w.skipped.Load(), "cached_bytes", w.s.accounts.bytes(), "residents", w.s.residents.len(), "took", time.Since(start).Round(time.Millisecond))
}

// room reports whether warming may add an account: under its limit, and
// room in the cache (cacheRoom) or among the residents.
func (w *warmer) room() bool {
	return int(w.warmed.Load()) < w.limit && (w.cacheRoom() || w.s.residents.room())
}

// cacheRoom reports whether the cache is under nine tenths of its bounds:
// warming adds full aggregates there first, then residents.
func (w *warmer) cacheRoom() bool {
	ac := w.s.accounts
	return ac.c.Len() < w.s.opts.CacheSize/10*9 && (ac.budget <= 0 || ac.bytes() < ac.budget/10*9)
}

// page reads streams in one request and caches each account that is free.
func (w *warmer) page(ctx context.Context, streams []string) error {
	reads, err := w.read.ReadCold(ctx, streams, coldPage)
	if err != nil {
		return err
	}
	for i, stream := range streams {
		if !w.room() {
			return nil
		}
		acc, err := w.s.fromCold(ctx, stream, strings.TrimPrefix(stream, domain.AccountStreamPrefix), reads[i])
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			w.s.log.Warn("account not warmed: its stream does not load", "stream", stream, "err", err)
		}
		if err != nil || !w.s.warmOne(stream, acc, w.cacheRoom()) {
			w.skipped.Add(1)
			continue
		}
		w.warmed.Add(1)
	}
	return nil
}

// warmOne caches acc as stream's aggregate (cache) or keeps it as its
// resident, unless a command holds or waits for the stream, has appends in
// flight on it, or has cached it or made it resident already; it reports
// whether it cached or kept it (the table may keep none: residents.put).
func (s *Service) warmOne(stream string, acc *domain.Account, cache bool) bool {
	unlock, ok := s.locks.tryLock(stream)
	if !ok {
		return false
	}
	defer unlock()
	if !s.pipes.idle(stream) || s.accounts.c.Contains(stream) || s.residents.has(stream) {
		return false
	}
	if cache {
		s.accounts.add(stream, acc)
		return true
	}
	res, tail, ok := domain.Compact(acc, s.residents.print)
	return ok && s.residents.put(stream, resident{res, tail, fromWarm, true})
}

// Warming reports how many accounts warming has loaded into the cache so far,
// and whether it has ended (or never started).
func (s *Service) Warming() (warmed int64, done bool) {
	w := s.warm.Load()
	if w == nil {
		return 0, true
	}
	select {
	case <-w.done:
		done = true
	default:
	}
	return w.warmed.Load(), done
}

// Warm warms the store's accounts again, in the background as after a start,
// up to limit of them (0: none), once a warming in progress has stopped: for
// accounts written into the store behind the service's back, as a bulk load
// does (the bench's many-accounts phases). Not concurrently with Close.
func (s *Service) Warm(limit int) {
	s.warm.Load().stop()
	s.warm.Store(startWarming(s, s.store, limit))
}
