package postgres

import (
	"context"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
)

// duplicateIDsWorkMem is the memory the duplicate IDs' hash or sort takes
// before it spills to disk (the audit's sets take the same: pgSetsSchema).
const duplicateIDsWorkMem = "64MB"

// DuplicateIDs calls fn with each event ID stored more than once among the
// events of "all" after `after` up to and including until, and the times it
// is stored, in the order of its first position. It counts the rows (a hash
// or a sort of the IDs in PostgreSQL, on disk beyond work_mem): the table's
// unique constraint refuses such an ID, and the count still finds one in a
// table whose constraint was dropped. The events up to until are committed
// (until is a position a reader of "all" saw), so the rows it counts are those
// such a reader reads.
func (s *Store) DuplicateIDs(ctx context.Context, after, until eventstore.Position, fn func(id string, times int64) error) error {
	if s.closed() {
		return ErrClosed
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '`+duplicateIDsWorkMem+`'`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT event_id::text, count(*) FROM events
			WHERE (transaction_id, position) > ($1::text::xid8, $2) AND (transaction_id, position) <= ($3::text::xid8, $4)
			GROUP BY event_id HAVING count(*) > 1 ORDER BY min(position)`,
			strconv.FormatUint(after.Commit, 10), prepareOf(after), strconv.FormatUint(until.Commit, 10), prepareOf(until))
		if err != nil {
			return err
		}
		var id string
		var times int64
		_, err = pgx.ForEachRow(rows, []any{&id, &times}, func() error { return fn(id, times) })
		return err
	})
	if err != nil {
		return classify(ctx, "duplicate IDs", err)
	}
	return nil
}

// prepareOf is a position's event position as the table's bigint holds it
// (the largest beyond it).
func prepareOf(p eventstore.Position) int64 {
	if p.Prepare < math.MaxInt64 {
		return int64(p.Prepare)
	}
	return math.MaxInt64
}
