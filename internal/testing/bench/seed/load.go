package seed

import (
	"context"
	"sync"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// Loader is a store that takes events decided elsewhere in bulk
// (eventstore/postgres: COPY in one transaction), for streams no one else
// writes meanwhile.
type Loader interface {
	Load(ctx context.Context, parts []eventstore.StreamAppend) error
}

// loadChunk is the accounts one Load carries (an open_account writes two
// events: the account's and its key's claim): within
// eventstore/postgres.MaxLoadEvents.
const loadChunk = 20_000

// recorder is a memory store that keeps every append it took, in order: a
// ledger.Service decides on it exactly as on any store, and the appends are
// then loaded into the real one. It offers only what a Store and a
// MultiAppender are (group commit), so the service asks it for nothing else.
type recorder struct {
	mem   *memory.Store
	mu    sync.Mutex
	parts []eventstore.StreamAppend
}

func (r *recorder) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	return eventstore.AppendOne(ctx, r, eventstore.StreamAppend{Stream: stream, Expected: expected, Events: events})
}

func (r *recorder) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	res, err := r.mem.AppendMulti(ctx, parts)
	if err == nil {
		r.mu.Lock()
		r.parts = append(r.parts, parts...)
		r.mu.Unlock()
	}
	return res, err
}

func (r *recorder) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	return r.mem.ReadStream(ctx, stream, from, dir, max)
}

// loadOpened opens accounts [from, to) as OpenAccounts does, deciding them
// through batches of a ledger.Service of its own over a recorder, then
// loading what it appended into dst.
func loadOpened(ctx context.Context, dst Loader, o OpenOptions, from, to int) error {
	rec := &recorder{mem: memory.New()}
	defer rec.mem.Close()
	svc := ledger.New(rec, ledger.Options{Producer: "bench-open", CacheSize: OpenBatch, Logger: o.Logger})
	for i := from; i < to && ctx.Err() == nil; i += OpenBatch {
		if err := openRange(ctx, svc, o.Body, i, min(i+OpenBatch, to)); err != nil {
			svc.Close()
			return err
		}
	}
	svc.Close()
	if err := ctx.Err(); err != nil {
		return err
	}
	return dst.Load(ctx, rec.parts)
}
