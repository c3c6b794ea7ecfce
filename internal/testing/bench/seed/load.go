package seed

import (
	"context"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
)

// Loader is a store that takes events decided elsewhere in bulk
// (eventstore/postgres: COPY in one transaction), for streams no one else
// writes meanwhile, and their snapshots.
type Loader interface {
	Load(ctx context.Context, parts []eventstore.StreamAppend) error
	WriteSnapshot(ctx context.Context, s eventstore.Snapshot) error
}

// loadChunk is the accounts one Load carries (an open_account writes two
// events: the account's and its key's claim): within
// eventstore/postgres.MaxLoadEvents.
const loadChunk = 20_000

// loadOpened opens accounts [from, to) as OpenAccounts does, deciding them
// through batches of a ledger.Service of its own over a recorder, then
// loading what it appended into dst.
func loadOpened(ctx context.Context, dst Loader, o OpenOptions, from, to int) error {
	rec := newRecorder()
	defer rec.close()
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
	return rec.cut().load(ctx, dst)
}
