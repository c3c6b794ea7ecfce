package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SetBeforeCommit sets a function that runs between an append's two round trips,
// on its connection inside its open transaction (nil: none).
func SetBeforeCommit(s *Store, f func(ctx context.Context, conn *pgx.Conn)) { s.beforeCommit = f }

// IDsUniqueByIndex is the query by which DuplicateIDs trusts the table's
// unique index on event_id (true) rather than count the rows.
const IDsUniqueByIndex = idsUniqueByIndex
