package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ListStreams implements eventstore.StreamLister: the streams' first events
// (revision 0), walked in the order of the (stream, revision) index from
// after on, so that each page reads its rows and stops. Names sort in the
// database's collation; the prefix is a filter, so the last page walks on to
// the end of the index.
func (s *Store) ListStreams(ctx context.Context, prefix, after string, max int) ([]string, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	if max < 1 {
		return nil, fmt.Errorf("eventstore/postgres: list streams: max %d is below 1", max)
	}
	rows, err := s.pool.Query(ctx, `SELECT stream FROM events WHERE stream > $2 AND revision = 0 AND starts_with(stream, $1)
		ORDER BY stream LIMIT $3`, prefix, after, max)
	if err != nil {
		return nil, classify(ctx, "list streams", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, classify(ctx, "list streams", err)
	}
	return names, nil
}
