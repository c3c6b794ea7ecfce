package audit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/projections"
)

// The fold keeps of an account's holds only the active ones and the last
// closed one (closedhold.go), so the closed holds a snapshot carries beyond
// those (a ledger's snapshot keeps up to 1,024) are checked against the holds
// read model instead: the audit compares that table with the store (whole in
// a full audit; an incremental one trusts the rows of holds closed before its
// checkpoint, TrustedFromCheckpoint), so a row there is trusted once that
// comparison passed, and a row that differs from the store is named there.
// One short query per snapshot on the read-model pool, streamed and merged
// by hold ID with the snapshot's closed holds, sorted: nothing kept across
// snapshots. Not in the audit's read-model snapshot tx: a table read there
// stays locked (ACCESS SHARE) until the audit ends, and a rebuild's switch,
// which drops the old generation, would wait for it and fail. A later read
// is as good: the query takes the generation the audit compares (its table
// by name) and rows of holds closed by the snapshot's revision, which is at
// or before that generation's checkpoint in the tx, and a closed hold's row
// is never changed once written. If a switch dropped that generation
// meanwhile, the snapshots left are counted unchecked, and the audit ends in
// an error naming the switch (liveSwitched). A snapshot at revision R must carry each closed
// hold as the account's row of a hold closed at or before R holds it (amount,
// status, expiry, key); and, saying it forgot no hold, every such hold.
// Findability is not in the table, so not checked here.

// snapshotHoldsSQL lists an account's holds closed at or before a revision:
// all of them ($3), or only those of the IDs given.
var snapshotHoldsSQL = `SELECT hold_id, amount, status, expires_at, idempotency_key FROM %s
	WHERE account_id = $1 AND status <> '` + string(domain.HoldStatusActive) + `' AND revision <= $2 AND ($3 OR hold_id = ANY($4::text[]))
	ORDER BY hold_id COLLATE "C"`

// holdsReadModel is where the fold checks the closed holds of snapshots: the
// holds table of the accounts read model's generation that the audit's
// read-model snapshot found live, at checkpoint pos there, read through q
// (the audit's own short-read connection, shortReads, not the snapshot's tx).
// dropped is set once that table is gone (a switch dropped the generation).
type holdsReadModel struct {
	ctx     context.Context
	q       Querier
	table   string
	pos     eventstore.Position
	dropped bool
}

// newHoldsReadModel is the holds table of the accounts read model among
// lives, read through q (short queries, each its own transaction); nil when
// there is none.
func newHoldsReadModel(ctx context.Context, q Querier, lives []liveGen) *holdsReadModel {
	for _, l := range lives {
		if l.name != projections.Accounts {
			continue
		}
		table := projections.View("holds")
		if l.gen > 0 {
			table = projections.Table("holds", l.gen)
		}
		return &holdsReadModel{ctx: ctx, q: q, table: table, pos: l.pos}
	}
	return nil
}

// checkSnapshotHolds checks the closed holds of snapshot sn of stream, whose
// revision's event is at or before position at, against the holds read
// model; a snapshot it cannot check (no read model, or one whose checkpoint
// is before at) is counted in snapshotHoldsUnchecked.
func (f *Fold) checkSnapshotHolds(stream string, sn snapshotCheck, at eventstore.Position) {
	rm := f.holdsRM
	if rm == nil || rm.dropped || at.Compare(rm.pos) > 0 {
		f.snapshotHoldsUnchecked++
		return
	}
	closed := make([]*domain.Hold, 0, len(sn.acc.Holds))
	for _, h := range sn.acc.Holds {
		if h.Status != domain.HoldStatusActive {
			closed = append(closed, h)
		}
	}
	all := !sn.acc.ForgotHolds()
	if len(closed) == 0 && !all {
		return
	}
	slices.SortFunc(closed, func(x, y *domain.Hold) int { return cmp.Compare(x.ID, y.ID) })
	ids := make([]string, len(closed))
	for i, h := range closed {
		ids[i] = h.ID
	}
	rows, err := rm.q.Query(rm.ctx, fmt.Sprintf(snapshotHoldsSQL, rm.table), sn.acc.ID, int64(sn.revision), all, ids)
	if err == nil {
		err = f.mergeSnapshotHolds(stream, sn, closed, rows)
	}
	if pgerr.IsUndefinedTable(err) {
		rm.dropped = true
		f.snapshotHoldsUnchecked++
		return
	}
	if err != nil {
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the closed holds of the snapshot of %s: %w", stream, err))
	}
}

// heldRow is a holds row as checkSnapshotHolds reads it.
type heldRow struct {
	id, status, key string
	amount          int64
	expires         *time.Time
}

// mergeSnapshotHolds walks the snapshot's closed holds and the rows, both
// sorted by hold ID, and names the first difference.
func (f *Fold) mergeSnapshotHolds(stream string, sn snapshotCheck, closed []*domain.Hold, rows pgx.Rows) error {
	defer rows.Close()
	i, diff := 0, ""
	var r heldRow
	for diff == "" && rows.Next() {
		if err := rows.Scan(&r.id, &r.amount, &r.status, &r.expires, &r.key); err != nil {
			return err
		}
		for ; i < len(closed) && closed[i].ID < r.id && diff == ""; i++ {
			diff = notClosedThere(closed[i], sn.revision)
		}
		switch {
		case diff != "":
		case i < len(closed) && closed[i].ID == r.id:
			diff = heldRowDiff(closed[i], r)
			i++
		default:
			diff = fmt.Sprintf("hold %s (%s, closed by revision %d) missing from a snapshot that says it forgot none", r.id, r.status, sn.revision)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if diff == "" && i < len(closed) {
		diff = notClosedThere(closed[i], sn.revision)
	}
	if diff != "" {
		f.violate(Violation{Invariant: InvSnapshot, Kind: "snapshot_mismatch", Stream: stream, Revision: int64(sn.revision), Message: fmt.Sprintf(
			"the snapshot of %s at revision %d differs from the holds read model's rows of the holds its account closed by then (%s): %s; "+
				"the snapshot or the row is wrong (the holds table's comparison names a row that differs from the store)", stream, sn.revision, f.holdsRM.table, diff)})
	}
	return nil
}

func notClosedThere(h *domain.Hold, rev uint64) string {
	return fmt.Sprintf("hold %s %s amount %d key %q in the snapshot, but the holds read model has no hold of that ID closed by revision %d", h.ID, h.Status, h.Amount, h.Key, rev)
}

// heldRowDiff compares a snapshot's closed hold with its row ("" when
// equal): the expiry as the table keeps it, to the microsecond.
func heldRowDiff(h *domain.Hold, r heldRow) string {
	sameExpiry := (r.expires == nil) == h.ExpiresAt.IsZero() && (r.expires == nil || r.expires.Equal(domain.Instant(h.ExpiresAt)))
	if h.Amount == r.amount && string(h.Status) == r.status && h.Key == r.key && sameExpiry {
		return ""
	}
	return fmt.Sprintf("hold %s %s amount %d key %q expires %v, not the stream's %s amount %d key %q expires %v (the holds read model's row)",
		h.ID, h.Status, h.Amount, h.Key, h.ExpiresAt, r.status, r.amount, r.key, r.expires)
}
