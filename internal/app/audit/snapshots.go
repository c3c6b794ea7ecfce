package audit

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// The account snapshots (invariant 7) are listed a page at a time and each
// decoded there once, so that one that does not decode is named at once; the
// fold keeps of each only its revision until it reaches it, and reads it
// again then (Fold.readSnapshot): the audit holds a page of snapshots and
// the one it checks, not every snapshot decoded (a ledger's keeps up to 1,024
// closed holds). Each snapshot found equal to the fold is recorded (its
// revision and the sha256 of its bytes, Fold.checked) in the checkpoint the
// audit stores, one per account. An incremental audit keeps only the snapshots of revisions
// after its checkpoint's revision of their account (whose events after the
// checkpoint the fold reads anyway) or of accounts opened since; of the
// others, of revisions the checkpoint passed or at it, trusts those the
// checkpoint records with the same bytes (when its audit compared them as
// the fold does: trustRecorded), and checks every other one, at that
// revision too (the row is the account after its last event's forgets),
// by folding its account's stream from its first event
// (checkPassedSnapshot); it
// reads, for a page, the checkpoint's revisions and records of its
// accounts (their bytes' sha256), not their states. A checkpointing audit
// lists them again once its fold reaches its head, for those written while
// it ran (snapshotswritten.go).

// snapshotPage is how many snapshots the audit lists at a time.
const snapshotPage = 1000

// snapshotCheck is a snapshot waiting for the fold to reach its revision.
type snapshotCheck struct {
	revision uint64
	// acc is the snapshot decoded, data its bytes; nil until the fold
	// reaches it when the fold reads it again then (readSnapshot).
	acc  *domain.Account
	data []byte
	// late: read again, it had been replaced by this later one since it was
	// listed (the ledger snapshots as it writes), perhaps after the audit's
	// head: checked if the fold reaches it, not reported if it does not.
	late bool
}

// checkSnapshotsOf hands the fold the account snapshots of a store that keeps
// them (only the account's, when set), to check as it reaches them, a page
// at a time; it returns how many.
func checkSnapshotsOf(ctx context.Context, store Store, f *Fold, account string) (int, error) {
	ss, ok := snapshotReaders(ctx, store, f)
	if !ok {
		return 0, nil
	}
	if account != "" {
		sn, err := ss.ReadSnapshot(ctx, domain.AccountStream(account))
		if errors.Is(err, eventstore.ErrSnapshotNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("audit: snapshots: %w", err)
		}
		return 1, f.checkSnapshotPage(ctx, store, []eventstore.Snapshot{sn})
	}
	n, after := 0, ""
	for {
		page, err := ss.ReadSnapshots(ctx, after, snapshotPage)
		if err != nil {
			return 0, fmt.Errorf("audit: snapshots: %w", err)
		}
		if err := f.checkSnapshotPage(ctx, store, page); err != nil {
			return 0, err
		}
		n += len(page)
		if len(page) < snapshotPage {
			return n, nil
		}
		after = page[len(page)-1].Stream
	}
}

// snapshotReaders gives the fold what it reads the snapshots it checks
// with, from a store that keeps them (ok).
func snapshotReaders(ctx context.Context, store Store, f *Fold) (eventstore.SnapshotStore, bool) {
	ss, ok := store.(eventstore.SnapshotStore)
	if !ok {
		return nil, false
	}
	f.readSnapshot = func(stream string) (eventstore.Snapshot, error) { return ss.ReadSnapshot(ctx, stream) }
	f.readRefunds = newRefundsReader(ctx, store)
	_, subjects := store.(eventstore.SubjectReader)
	f.noSubjects = !subjects
	if sr, ok := store.(eventstore.StreamReader); ok {
		f.readStreamTo = func(stream string, rev int64, fn func(eventstore.RecordedEvent) error) error {
			return readStreamRange(ctx, sr, stream, 0, rev, fn)
		}
	}
	return ss, true
}

// checkSnapshotPage has the fold check a page of snapshots, and, in an
// incremental audit, keep of them only those after its checkpoint.
func (f *Fold) checkSnapshotPage(ctx context.Context, store Store, page []eventstore.Snapshot) error {
	f.CheckSnapshots(page)
	if f.from == nil {
		return nil
	}
	sr, _ := store.(eventstore.StreamReader)
	return f.skipSnapshotsBefore(ctx, sr, page)
}

// CheckSnapshots has the fold compare each snapshot with the account's fold at
// the snapshot's revision (invariant 7). A snapshot that does not decode (its
// version, stream or hash) is a violation at once; one the fold never reaches,
// at Finish. Call it before the first Apply.
func (f *Fold) CheckSnapshots(snaps []eventstore.Snapshot) {
	if f.snapshots == nil {
		f.snapshots = map[string]snapshotCheck{}
	}
	for _, sn := range snaps {
		acc, ok := f.decodeSnapshot(sn)
		if !ok {
			continue
		}
		data := sn.Data
		if f.readSnapshot != nil {
			acc, data = nil, nil // read again when the fold reaches it
		}
		f.snapshots[sn.Stream] = snapshotCheck{revision: sn.Revision, acc: acc, data: data}
	}
}

// decodeSnapshot decodes a snapshot, naming one that does not decode, holds
// another revision than it is filed at, or, on a store that reads no
// subjects, says it forgot closed holds or refunded originals: each one a
// ledger's cold load ignores (domain.DecodeSnapshot, and the ledger's
// snapshotAccount).
func (f *Fold) decodeSnapshot(sn eventstore.Snapshot) (*domain.Account, bool) {
	acc, err := domain.DecodeSnapshot(sn.Stream, sn.Data)
	switch {
	case err != nil:
	case uint64(acc.Revision) != sn.Revision:
		err = fmt.Errorf("filed at revision %d, holds revision %d", sn.Revision, acc.Revision)
	case f.noSubjects && (acc.ForgotHolds() || acc.ForgotRefunds()):
		err = fmt.Errorf("it says it forgot closed holds or refunded originals, which no ledger on a store that reads no events by subject does")
	}
	if err != nil {
		f.violate(Violation{Invariant: InvSnapshot, Kind: "snapshot_unreadable", Stream: sn.Stream, Revision: int64(sn.Revision), Message: fmt.Sprintf("snapshot of %s: %v", sn.Stream, err)})
		return nil, false
	}
	return acc, true
}

// checkSnapshot compares the snapshot of stream, if at a's revision, whose
// event is at or before position at, with a and its closed holds with the
// holds read model.
func (f *Fold) checkSnapshot(stream string, a *domain.Account, at eventstore.Position) {
	f.checkSnapshotIn(stream, a, f.streams[stream], at)
}

// checkSnapshotIn is checkSnapshot with ss, the stream's state that the fold
// of a keeps beside it: its last closed hold (sameSnapshot) and the total of
// its refunds up to a's revision (refundsTotal); nil: neither is known.
func (f *Fold) checkSnapshotIn(stream string, a *domain.Account, ss *streamState, at eventstore.Position) {
	total := refundsTotal{unknown: true}
	if ss != nil {
		total = ss.refunds
	}
	sn, ok := f.snapshots[stream]
	if !ok || int64(sn.revision) != a.Revision {
		return
	}
	delete(f.snapshots, stream)
	if sn.acc == nil && !f.readSnapshotAgain(stream, &sn) {
		return
	}
	same, diff := sameSnapshot(ss, sn.acc, a)
	if same {
		same, diff = f.sameRefunded(stream, sn.acc, a, total)
	}
	if !same {
		f.violate(Violation{Invariant: InvSnapshot, Kind: "snapshot_mismatch", Stream: stream, Revision: int64(sn.revision), Message: fmt.Sprintf("the snapshot of %s at revision %d is not the fold of its stream: %s", stream, sn.revision, diff)})
		return
	}
	f.recordChecked(stream, projections.CheckedSnapshot{Revision: sn.revision, SHA256: sha256.Sum256(sn.data)})
	f.checkSnapshotHolds(stream, sn, at)
}

// readSnapshotAgain reads the snapshot of stream the fold has reached into
// sn.acc, and reports whether there is one at its revision to check: one
// replaced since by a later one waits for the fold to reach that (late), one
// deleted since has nothing to check.
func (f *Fold) readSnapshotAgain(stream string, sn *snapshotCheck) bool {
	got, err := f.readSnapshot(stream)
	switch {
	case errors.Is(err, eventstore.ErrSnapshotNotFound):
		return false
	case err != nil:
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the snapshot of %s: %w", stream, err))
		return false
	case got.Revision > sn.revision:
		f.snapshots[stream] = snapshotCheck{revision: got.Revision, late: true}
		return false
	case got.Revision < sn.revision:
		f.violate(Violation{Invariant: InvSnapshot, Kind: "snapshot_mismatch", Stream: stream, Revision: int64(sn.revision), Message: fmt.Sprintf(
			"the snapshot of %s, listed at revision %d, was at revision %d when the fold reached it: a store keeps a stream's latest", stream, sn.revision, got.Revision)})
		return false
	}
	acc, ok := f.decodeSnapshot(got)
	sn.acc, sn.data = acc, got.Data
	return ok
}

// finishSnapshots reports the snapshots the fold never reached, but those
// replaced by a later one during the audit.
func (f *Fold) finishSnapshots() {
	for _, s := range slices.Sorted(maps.Keys(f.snapshots)) {
		sn := f.snapshots[s]
		if sn.late {
			continue
		}
		f.violate(Violation{Invariant: InvSnapshot, Kind: "snapshot_beyond_stream", Stream: s, Revision: int64(sn.revision), Message: fmt.Sprintf("the snapshot of %s is at revision %d, beyond its stream (or of a stream that failed to fold)", s, sn.revision)})
	}
}

// recordChecked records c as the snapshot of stream this audit found equal
// to the fold, in place of any recorded before: the checkpoint's record read
// with the account's row (recordResumed), or one this audit checked at an
// earlier revision (the fold reaches a stream's snapshots in order).
func (f *Fold) recordChecked(stream string, c projections.CheckedSnapshot) {
	if f.checked == nil {
		f.checked = map[string]projections.CheckedSnapshot{}
	}
	f.checked[stream] = c
}

// recordResumed records c, the checked snapshot the checkpoint records for
// stream (read with its row), unless this audit checked one already, which
// wins whatever its revision: it is the one the store held (an incremental
// audit checks a passed snapshot before it reads the account's row,
// checkPassedSnapshots). A checkpoint without snapshot_holds_compared
// (trustRecorded false) passes on none of its records: this audit's
// checkpoint says every snapshot it records had every refunded sum checked.
func (f *Fold) recordResumed(stream string, c projections.CheckedSnapshot) {
	if _, ok := f.checked[stream]; !ok && f.trustRecorded {
		f.recordChecked(stream, c)
	}
}

// skipSnapshotsBefore trusts, of a page of snapshots, those of revisions the
// checkpoint passed or at its revision of their account that it records
// with the same bytes, checks the other ones of those revisions by folding
// their streams from the first event (checkPassedSnapshots), and keeps the
// others: of revisions after it, or of accounts the checkpoint does not
// hold. Not one at the checkpoint's revision against its row: the row is
// the account after the forgets of its event, which the compare at that
// revision must come before (foldAccountEvent; docs/design.md, invariant 7).
func (f *Fold) skipSnapshotsBefore(ctx context.Context, sr eventstore.StreamReader, page []eventstore.Snapshot) error {
	ids := make([]string, 0, len(page))
	sums := make(map[string][sha256.Size]byte, len(page))
	for _, sn := range page {
		if _, ok := f.snapshots[sn.Stream]; ok {
			ids = append(ids, strings.TrimPrefix(sn.Stream, domain.AccountStreamPrefix))
			sums[sn.Stream] = sha256.Sum256(sn.Data)
		}
	}
	var passed []string // at or before the checkpoint's revision of their account, not recorded
	err := projections.Checkpoints.AuditAccountNext(ctx, f.resumed.q, f.resumed.id, ids, func(row projections.AuditSnapshotNext) error {
		stream := domain.AccountStream(row.AccountID)
		sum := sums[stream]
		switch rev := f.snapshots[stream].revision; {
		case rev+1 <= row.Next && f.trustRecorded && row.CheckedSHA256 != nil && row.Checked == rev && bytes.Equal(row.CheckedSHA256, sum[:]):
			delete(f.snapshots, stream)
			f.snapshotsTrusted++
		case rev+1 <= row.Next:
			passed = append(passed, row.AccountID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := f.checkPassedSnapshots(ctx, sr, passed); err != nil {
		return err
	}
	return f.reloadErr
}

// checkPassedSnapshots checks the snapshots of the accounts ids, of
// revisions the checkpoint passed and not recorded by it, each by folding
// its account's stream from the first event, then reads those accounts into
// the fold, so that the checkpoint the audit stores records what it checked
// (their streams are folded before the fold holds their stream state, which
// the check must not see).
func (f *Fold) checkPassedSnapshots(ctx context.Context, sr eventstore.StreamReader, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	for _, id := range ids {
		if err := f.checkPassedSnapshot(ctx, sr, domain.AccountStream(id)); err != nil {
			return err
		}
	}
	return f.loadAccounts(ctx, ids, false)
}

// checkPassedSnapshot checks the snapshot of stream, of a revision the
// checkpoint passed, against the account's stream folded from its first
// event up to it by the replay's aggregate (newReplayAccount), read a page
// of events at a time (counted in snapshotsFromStart): it costs the
// account's events up to the snapshot, and the memory of a page and an
// account. Not from the snapshot the checkpoint records below it: the audit
// that checked it compared only what its bounded fold keeps (boundAccount)
// and checked the rest apart (the read model's holds, the store's refunds),
// not all of it (closed holds' findability), which a fold from it would adopt
// unchecked (docs/design.md, invariant 7). A stream
// that does not fold up to the snapshot's revision leaves it to
// finishSnapshots to name.
func (f *Fold) checkPassedSnapshot(ctx context.Context, sr eventstore.StreamReader, stream string) error {
	if sr == nil {
		return fmt.Errorf("audit: --from: the store does not read a stream, to check the snapshot of %s the checkpoint does not record", stream)
	}
	f.snapshotsFromStart++
	return f.checkSnapshotFromStart(ctx, sr, stream)
}

// checkSnapshotFromStart checks the snapshot of stream the fold waits for
// (f.snapshots) against the account's stream folded from its first event up
// to it by the replay's aggregate (newReplayAccount), read a page at a time.
func (f *Fold) checkSnapshotFromStart(ctx context.Context, sr eventstore.StreamReader, stream string) error {
	a, ss := newReplayAccount(stream), &streamState{}
	return f.checkSnapshotFolding(ctx, sr, stream, a, ss, false)
}

// checkSnapshotFolding checks the snapshot of stream the fold waits for
// (f.snapshots) against a, at revision ss.next-1, folded on up to the
// snapshot's revision, read a page at a time, in the main fold's order
// (foldAccountEvent: compared at its revision before the forgets of its
// event; bounded: forgetting as the main fold's accounts do, else keeping
// what a keeps). A stream that does not fold up to the snapshot's revision
// leaves it to finishSnapshots to name.
func (f *Fold) checkSnapshotFolding(ctx context.Context, sr eventstore.StreamReader, stream string, a *domain.Account, ss *streamState, bounded bool) error {
	broken := false
	err := readStreamRange(ctx, sr, stream, ss.next, int64(f.snapshots[stream].revision), func(re eventstore.RecordedEvent) error {
		m, err := domain.DecodeMetadata(re.Metadata)
		var payload any
		if err == nil {
			payload, err = domain.DecodeEvent(re.Type, re.Data)
		}
		if err == nil { // decoded once, as applyAccount folds
			err = foldAccountEvent(a, ss, storedEvent(re, m), payload, bounded, nil, func() {
				ss.next = re.Revision + 1
				f.checkSnapshotIn(stream, a, ss, re.Position)
			})
		}
		broken = err != nil
		return err
	})
	if broken || errors.Is(err, eventstore.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("audit: the stream of %s up to its snapshot: %w", stream, err)
	}
	return f.reloadErr
}
