package audit

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRunSchemaDroppedAfterItsSessionBroke: a full audit stopped in its
// end-of-audit checks (its session's connection closed by the cancelled
// query) still drops its run's schema as it ends, from another session
// under the run's lock. From review (rev2): the schema was left behind.
func TestRunSchemaDroppedAfterItsSessionBroke(t *testing.T) {
	ctx := context.Background()
	pool, s := newTestRunSets(t)
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

// TestRunTablesLeftAloneByAutovacuum: a full audit's run's history tables are
// created with autovacuum off (historySchema): only inserted into, read whole
// once, analyzed by finish (pgSets.analyze), not vacuumed and analyzed again
// and again by autovacuum's workers as the fold grows them (PostgreSQL's CPU
// on a realistic history, BENCHMARKS.md).
func TestRunTablesLeftAloneByAutovacuum(t *testing.T) {
	ctx := context.Background()
	_, s := newTestRunSets(t)
	defer s.close()
	var tables, off int
	err := s.conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE 'autovacuum_enabled=false' = ANY(c.reloptions))
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, s.run).Scan(&tables, &off)
	if err != nil {
		t.Fatal(err)
	}
	if tables != len(historyTables) || off != tables {
		t.Fatalf("run %s: %d tables, %d of them with autovacuum off; want all %d", s.run, tables, off, len(historyTables))
	}
	if err := s.analyze(ctx); err != nil {
		t.Fatal(err)
	}
}

// newTestRunSets is a full audit's sets in a new run's schema of the test
// database, and the pool they came from (closed when the test ends).
func newTestRunSets(t *testing.T) (*pgxpool.Pool, *pgSets) {
	t.Helper()
	pool := testPool(t)
	s, err := newRunSets(context.Background(), pool, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	return pool, s
}
