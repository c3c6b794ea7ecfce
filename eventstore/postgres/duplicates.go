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
// is stored, in the order of its first position. The events up to until are
// committed (until is a position a reader of "all" saw), so the rows it looks
// at are those such a reader reads.
//
// When the table's unique index on event_id stands whole (idsUniqueByIndex),
// it answers none without reading a row: PostgreSQL refused every second
// insert of an ID while the index stood, and could not have built it (nor
// the constraint that owns it) over rows holding an ID twice, so no two rows
// of the table share an ID. Otherwise (the chaos self-test's duplicate drops
// the constraint) it counts the rows: a hash or a sort of the IDs in
// PostgreSQL, on disk beyond work_mem.
func (s *Store) DuplicateIDs(ctx context.Context, after, until eventstore.Position, fn func(id string, times int64) error) error {
	if s.closed() {
		return ErrClosed
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var unique bool
		if err := tx.QueryRow(ctx, idsUniqueByIndex).Scan(&unique); err != nil || unique {
			return err
		}
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

// idsUniqueByIndex answers whether the events table, as the store's queries
// name it, holds each event ID at most once by a unique index that PostgreSQL
// enforces on every row a reader of "all" reads: a plain table (not a view,
// not partitioned) that no table inherits from (a child's rows are read with
// the parent's and are outside its index), with a unique index checked at
// each insert (indimmediate: a deferrable one is checked by a trigger at
// commit, which session_replication_role = replica or disabled triggers skip),
// valid, ready and live, on the event_id column alone, a uuid column (another
// type's collation could make two IDs equal that its index holds apart), NOT
// NULL (a unique index lets NULLs repeat), with the type's default operator
// class (uuid's equality), no expression and no predicate (a partial index
// leaves rows out).
// events_event_id_key, as migration 00001 made it, is such an index.
const idsUniqueByIndex = `SELECT EXISTS (SELECT FROM pg_class c
	JOIN pg_index i ON i.indrelid = c.oid
	JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
	JOIN pg_opclass o ON o.oid = i.indclass[0]
	WHERE c.oid = 'events'::regclass AND c.relkind = 'r'
		AND NOT EXISTS (SELECT FROM pg_inherits h WHERE h.inhparent = c.oid)
		AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indisready AND i.indislive
		AND i.indnatts = 1 AND i.indexprs IS NULL AND i.indpred IS NULL
		AND a.attname = 'event_id' AND a.atttypid = 'uuid'::regtype AND a.attnotnull AND NOT a.attisdropped AND o.opcdefault)`

// prepareOf is a position's event position as the table's bigint holds it
// (the largest beyond it).
func prepareOf(p eventstore.Position) int64 {
	if p.Prepare < math.MaxInt64 {
		return int64(p.Prepare)
	}
	return math.MaxInt64
}
