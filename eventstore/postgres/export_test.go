package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SetBeforeCommit sets a function that runs between an append's two round trips,
// on its connection inside its open transaction (nil: none).
func SetBeforeCommit(s *Store, f func(ctx context.Context, conn *pgx.Conn)) { s.beforeCommit = f }
