package audit

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// Snapshots written while an audit runs (issue 23). The audit lists the
// snapshots before it reads the head it folds to (readHead); the ledger
// keeps writing them as it writes (a hot account's at each of its turns), so
// one may land after the listing at a revision the fold passes, or after the
// fold passed the revision of the one listed: the fold checks neither, and
// its checkpoint would not record them. An incremental audit from that
// checkpoint would then fold each such account from its first event
// (checkPassedSnapshot): a nightly audit's cost would grow with a hot
// account's whole history. So a checkpointing audit, once its fold has
// reached the head and before it carries its state, lists the snapshots
// again (checkSnapshotsWritten) and checks each one of a revision its fold
// passed that it did not check, by a side fold of that one account from the
// audit's own base: the checkpoint row it resumed from (its revision C0
// before the snapshot's: the events after C0 only, sideFromRow), else from
// the stream's first event (a full audit, an account opened since, a
// snapshot at or before C0), compared as the main fold compares
// (checkSnapshotIn), and recorded as checked (recordChecked). What remains:
// one written after this listing, which the next incremental audit folds
// from the first event (docs/design.md, invariant 7).

// checkSnapshotsWritten lists the store's snapshots again, a page at a
// time, and checks those written while the fold ran (checkWritten). Only a
// checkpointing audit whose fold found nothing wrong: the check is there for
// the records of the checkpoint, which an audit that names a violation does
// not store (and one the fold named would be named again).
func (r *auditRun) checkSnapshotsWritten(ctx context.Context) error {
	ss, ok := r.store.(eventstore.SnapshotStore)
	if !ok || !r.opts.SaveCheckpoint || r.f.ViolationCount() > 0 {
		return nil
	}
	sr, _ := r.store.(eventstore.StreamReader)
	for after := ""; ; {
		page, err := ss.ReadSnapshots(ctx, after, snapshotPage)
		if err != nil {
			return fmt.Errorf("audit: snapshots, listed again: %w", err)
		}
		for _, sn := range page {
			if err := r.f.checkWritten(ctx, sr, sn); err != nil {
				return err
			}
		}
		if len(page) < snapshotPage {
			return nil
		}
		after = page[len(page)-1].Stream
	}
}

// checkWritten checks sn, listed once the fold reached the audit's head,
// when it is of an account the fold holds, at a revision the fold passed,
// and not the one the fold checked; one after the head is the next audit's,
// one the fold waits for still is named by finishSnapshots, one of an
// account an incremental audit did not read (no event since its
// checkpoint) is left to the next audit (checkPassedSnapshot).
func (f *Fold) checkWritten(ctx context.Context, sr eventstore.StreamReader, sn eventstore.Snapshot) error {
	stream := sn.Stream
	id, ok := strings.CutPrefix(stream, domain.AccountStreamPrefix)
	ss := f.streams[stream]
	if !ok || ss == nil || f.Accounts[id] == nil || sn.Revision >= ss.next || f.badStream[stream] {
		return nil
	}
	if pending, ok := f.snapshots[stream]; ok && !pending.late {
		return nil
	}
	if c, ok := f.checked[stream]; ok && c.Revision == sn.Revision && c.SHA256 == sha256.Sum256(sn.Data) {
		return nil
	}
	acc, ok := f.decodeSnapshot(sn) // one that does not decode is named
	if !ok {
		return nil
	}
	if f.snapshots == nil {
		f.snapshots = map[string]snapshotCheck{}
	}
	f.snapshots[stream] = snapshotCheck{revision: sn.Revision, acc: acc, data: sn.Data}
	f.snapshotsWritten++
	if sr == nil {
		return fmt.Errorf("audit: the store does not read a stream, to check the snapshot of %s written while the audit ran", stream)
	}
	if at, ok := f.resumedAt(id); ok && uint64(at) < sn.Revision { // at it: the row is after its forgets (skipSnapshotsBefore)
		return f.sideFromRow(ctx, sr, stream, id)
	}
	return f.checkSnapshotFromStart(ctx, sr, stream)
}

// resumedAt is the revision of account id in the checkpoint an incremental
// audit resumed from, when the fold read its row.
func (f *Fold) resumedAt(id string) (int64, bool) {
	if f.resumed == nil {
		return 0, false
	}
	at, ok := f.resumed.at[id]
	return at[0], ok
}

// sideFromRow checks the snapshot of stream the fold waits for against the
// checkpoint's row of account id (read again, as the fold read it: bounded
// as its accounts are, with the row's last closed hold and refunds' total),
// folded on from the row's revision up to the snapshot's: the base the
// audit resumed from, anchored by its digest, and the events after it.
func (f *Fold) sideFromRow(ctx context.Context, sr eventstore.StreamReader, stream, id string) error {
	r := f.resumed
	var (
		a  *domain.Account
		ss *streamState
	)
	err := projections.Checkpoints.LoadAuditAccounts(ctx, r.q, r.id, []string{id}, false, func(row projections.AuditAccount) error {
		var err error
		a, ss, err = rowAccount(stream, row)
		return err
	})
	if err == nil && a == nil {
		err = fmt.Errorf("no row of %s", id)
	}
	if err != nil {
		return fmt.Errorf("audit: checkpoint %d, to check the snapshot of %s written while the audit ran: %w", r.id, stream, err)
	}
	return f.checkSnapshotFolding(ctx, sr, stream, a, ss, true)
}
