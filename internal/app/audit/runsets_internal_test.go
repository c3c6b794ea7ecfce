package audit

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestRunSchemaDroppedAfterItsSessionBroke: a full audit stopped in its
// end-of-audit checks (its session's connection closed by the cancelled
// query) still drops its run's schema as it ends, from another session
// under the run's lock. From review (rev2): the schema was left behind.
func TestRunSchemaDroppedAfterItsSessionBroke(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, devtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := newRunSets(ctx, pool, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	run := s.run
	if err := s.conn.Conn().Close(ctx); err != nil { // as pgx closes it when a query is cancelled
		t.Fatal(err)
	}
	s.close()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, run).Scan(&exists); err != nil || exists {
		t.Fatalf("run schema %s after the audit ended, its session broken: exists %v (%v)", run, exists, err)
	}
}
