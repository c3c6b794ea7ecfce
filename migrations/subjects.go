package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"

	"github.com/ledgerworks/ledger/domain"
)

// subjectsVersion is migration 00027 (issue 23): every hold event and every
// refund stored without a subject gets the one the ledger writes today
// (domain.EventSubject, the rule's one home). One written by a build before
// events had subjects (before 00007's build, or an instance of one still
// serving during a rolling upgrade) has none in its row, so the store's read
// of a subject (eventstore.SubjectReader) missed it: the ledger's recall of a
// refunded original or a closed hold it forgot (domain.RecallRefunded,
// RecallHold) and the audit's check of a snapshot's refunded sums. Only the
// indexed column changes: the event's metadata, and so its chain hash and
// whether the ledger counts the hold or the original findable, stay as
// written. docs/design.md ("Closed holds and refunded originals found by
// their subject") says why, docs/operations.md ("Upgrading") what it costs.
//
// It is a Go migration, not SQL, so that the subject is derived by the
// domain's decoder and EventSubject rather than a second copy of the rule in
// SQL (which also parsed every deposit's data as jsonb, and jsonb refuses the
// "\u0000" a client's metadata may hold). It runs without a transaction, in
// committed batches by position (subjectsBatch rows each): no snapshot is
// held across the scan, so the "all" readers (postgres.VisibleBelow) see
// what is appended meanwhile, and a failure keeps the batches done; goose
// records version 27 only once the whole scan succeeded, and a rerun
// continues from the rows still without a subject.
const subjectsVersion = 27

// subjectsBatch is how many candidate rows one transaction of 00027 reads.
const subjectsBatch = 5000

// subjectsCandidates lists, after a position, the rows without a subject
// that may need one: the hold events, and the credits and debits whose data
// holds the bytes "refund" (a refund's reason; a byte search, not a parse,
// so that a deposit or withdrawal is never decoded). The bytes are a
// parameter (refundBytes), not a literal: a literal '\x...' means them only
// under standard_conforming_strings on, and a database set off would read it
// as other text, match no row and skip every refund (a reviewer of 26434d3).
const subjectsCandidates = `SELECT position, type, data FROM events
WHERE position > $1 AND subject IS NULL
  AND (type IN ('HoldPlaced', 'HoldCaptured', 'HoldReleased')
    OR (type IN ('Credited', 'Debited') AND position($3::bytea IN data) > 0))
ORDER BY position LIMIT $2`

// refundBytes are the bytes subjectsCandidates searches a credit's or
// debit's data for: a refund's reason as the ledger writes it.
var refundBytes = []byte(domain.ReasonRefund)

// subjectsUpdate sets the subjects of one batch; a row given one meanwhile
// (by nothing today: no writer changes a stored row) keeps it.
const subjectsUpdate = `UPDATE events e SET subject = v.subject
FROM unnest($1::bigint[], $2::text[]) AS v(position, subject)
WHERE e.position = v.position AND e.subject IS NULL`

// subjectsMigration is 00027 for goose's provider.
func subjectsMigration() *goose.Migration {
	return goose.NewGoMigration(subjectsVersion,
		&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error { return BackfillSubjects(ctx, db, subjectsBatch, nil) }},
		// The subjects stay: the build before reads them as its own (it
		// writes them so).
		&goose.GoFunc{RunDB: func(context.Context, *sql.DB) error { return nil }})
}

// BackfillSubjects is 00027's body: it gives each candidate row its subject,
// batch rows a transaction. afterBatch, when not nil, runs after each
// committed batch with the last position read (a test's hook).
func BackfillSubjects(ctx context.Context, db *sql.DB, batch int, afterBatch func(last int64)) error {
	var last int64
	for {
		next, n, err := backfillBatch(ctx, db, last, batch)
		if err != nil {
			return fmt.Errorf("migration 00027: events after position %d: %w", last, err)
		}
		if n == 0 {
			return nil
		}
		last = next
		if afterBatch != nil {
			afterBatch(last)
		}
	}
}

// backfillBatch reads up to batch candidates after position last and sets the
// subjects of those that have one, in one transaction. It returns the last
// position read and how many rows it read.
func backfillBatch(ctx context.Context, db *sql.DB, last int64, batch int) (int64, int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	rows, err := tx.QueryContext(ctx, subjectsCandidates, last, batch, refundBytes)
	if err != nil {
		return 0, 0, err
	}
	var positions []int64
	var subjects []string
	n := 0
	for rows.Next() {
		var pos int64
		var typ string
		var data []byte
		if err := rows.Scan(&pos, &typ, &data); err != nil {
			rows.Close()
			return 0, 0, err
		}
		n, last = n+1, pos
		payload, err := domain.DecodeEvent(typ, data)
		if err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("position %d: %w", pos, err)
		}
		if s := domain.EventSubject(domain.NewEvent{Type: typ, Data: payload}); s != "" {
			positions, subjects = append(positions, pos), append(subjects, s)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	if len(positions) > 0 {
		if _, err := tx.ExecContext(ctx, subjectsUpdate, positions, subjects); err != nil {
			return 0, 0, err
		}
	}
	return last, n, tx.Commit()
}
