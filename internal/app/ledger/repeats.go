package ledger

import (
	"bytes"
	"context"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// A command's append to an account or a transfer that the store took for a
// repeat of events of the same IDs (another decision of its key, docs/design.md
// section 1) is never answered from the decision it carried: it is decided
// again on the store's head (afterRefusedAppend, decideOnTransfer,
// handleTransactionSaga). The store
// tells a repeat where it can (reportsRepeats); where it cannot (KurrentDB),
// repeatFinder reads the append's last event back.

// repeatFinder tells whether a command's append to an account or a transfer
// (or a capture saga's claim, startCaptureTo), answered as written (w), wrote
// nothing because the store held events of the same IDs.
type repeatFinder interface {
	foundAt(ctx context.Context, stream string, w written) (repeat bool, err error)
}

// reportsRepeats reports whether store tells a repeat from a fresh write
// (eventstore.AppendResult.Idempotent): PostgreSQL and memory do; the
// KurrentDB server answers both alike.
func reportsRepeats(store Store) bool {
	r, ok := store.(interface{ ReportsIdempotentAppends() bool })
	return ok && r.ReportsIdempotentAppends()
}

// repeatsFor is the repeatFinder the store calls for: the store's own word
// where it reports repeats (no read on the hot path), a read-back otherwise.
func repeatsFor(s *Service, store Store) repeatFinder {
	if reportsRepeats(store) {
		return reportedRepeats{}
	}
	return readBackRepeats{s}
}

// reportedRepeats takes the store's word (written.idempotent).
type reportedRepeats struct{}

func (reportedRepeats) foundAt(_ context.Context, _ string, w written) (bool, error) {
	return w.idempotent, nil
}

// readBackRepeats reads the last event of an append back (one read of one
// event per append) and compares it with the one appended: its
// type, its data and its metadata (the instance's time, and the chain hash,
// which covers every event of the append and the head they were decided on).
// Any difference is a repeat of another decision. Two instances
// that wrote byte-identical events (the same decision on the same clock)
// cannot be told apart, and need not be but for the reply's duplicate flag.
type readBackRepeats struct{ s *Service }

func (r readBackRepeats) foundAt(ctx context.Context, stream string, w written) (bool, error) {
	if w.idempotent || len(w.events) == 0 {
		return w.idempotent, nil
	}
	last := w.events[len(w.events)-1]
	evs, err := r.s.store.ReadStream(ctx, stream, last.Revision, eventstore.Forwards, 1)
	if err != nil {
		return false, err
	}
	if len(evs) != 1 || evs[0].Revision != last.Revision || evs[0].ID != last.ID {
		return false, fmt.Errorf("ledger: %s: the event appended at revision %d (%s) does not read back (%d events read)", stream, last.Revision, last.ID, len(evs))
	}
	meta, err := domain.EncodeMetadata(last.Metadata) // the bytes appended
	if err != nil {
		return false, err
	}
	return evs[0].Type != last.Type || !bytes.Equal(evs[0].Data, last.Data) || !bytes.Equal(evs[0].Metadata, meta), nil
}
