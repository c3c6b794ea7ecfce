package audit

import (
	"context"
	"fmt"

	"github.com/ledgerworks/ledger/eventstore"
)

// duplicateIDer is an event store that answers invariant 5's "every event ID
// stored once" itself, by a set query over what it stores (a PostgreSQL
// store: its events table, eventstore/postgres.Store.DuplicateIDs).
type duplicateIDer interface {
	DuplicateIDs(ctx context.Context, after, until eventstore.Position, fn func(id string, times int64) error) error
}

// storeIDs is the duplicate-ID check of a full or incremental audit of such a
// store, run beside the fold on a connection of the store's: the events the
// fold reads (after its start up to its head) are counted where they are
// stored, instead of each ID being copied into the sets' audit_ids and
// counted there after the fold. It finds the IDs and counts that copy finds:
// the fold reads every committed event of "all" up to its head, and the store
// counts the same rows (a row stored twice is read twice, the "all" order
// being a total order of rows). The violations keep the copy's kind and
// message, but not its order: they come by their first position, where the
// copy's came by the fold's order ((transaction_id, position)), and the two
// differ when transactions commit out of order, so a list cut short by the
// audit's maximum may name other IDs of the same set.
type storeIDs struct {
	cancel context.CancelFunc
	done   chan struct{}
	found  []Violation // the first max violations, in the order of first positions
	more   int         // the violations past those
	err    error
}

// idsFromStore starts the run's check of the event IDs by the store (its
// PostgreSQL sets'): from the start of "all" up to the head, whatever the
// fold's start. An incremental audit counting after its checkpoint alone
// would miss an ID stored before the checkpoint and again after it; a
// resumed full audit's check stopped with the stopped run. While the store's
// unique index on event_id stands whole the store answers without reading a
// row; where it does not, it counts every event's ID, as a full audit does.
func (r *auditRun) idsFromStore(ctx context.Context) {
	f := r.f
	ps, ok := f.sets.(*pgSets)
	if !ok {
		return
	}
	ps.idsFromStore(ctx, r.store, eventstore.Start, r.head, f.MaxViolations)
}

// idsFromStore starts, when store answers it (duplicateIDer), the check of the
// event IDs after from up to and including head: the sets then keep no ID
// (eventID) and finish reports what the store found. Without such a store
// the IDs go through audit_ids.
func (s *pgSets) idsFromStore(ctx context.Context, store any, from, head eventstore.Position, max int) {
	d, ok := store.(duplicateIDer)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	ids := &storeIDs{cancel: cancel, done: make(chan struct{})}
	s.storeIDs = ids
	go func() {
		defer close(ids.done)
		ids.err = d.DuplicateIDs(ctx, from, head, func(id string, times int64) error {
			if len(ids.found) == max {
				ids.more++
				return nil
			}
			ids.found = append(ids.found, Violation{Invariant: InvStreams, Kind: "duplicate_event_id",
				Message: fmt.Sprintf("event ID %s is stored %d times", id, times)})
			return nil
		})
	}()
}

// report waits for the store's answer and reports its violations in f.
func (ids *storeIDs) report(f *Fold) error {
	<-ids.done
	if ids.err != nil {
		return fmt.Errorf("audit: duplicate_event_id: %w", ids.err)
	}
	for _, v := range ids.found {
		f.violate(v)
	}
	f.violations += ids.more
	return nil
}

// stop ends the check, if one runs, whatever it found (close).
func (ids *storeIDs) stop() {
	if ids != nil {
		ids.cancel()
		<-ids.done
	}
}
