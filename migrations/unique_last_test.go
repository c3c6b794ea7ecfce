package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// TestUniqueIndexesBuiltBeforeTheirConstraints (migration 00020): a rebuild's
// create_secondary_indexes builds all of a generation's unique indexes before
// it makes any of them a constraint, whose ALTER waits for the table's
// readers. With a reader of entries left open and a duplicate (account_id,
// revision) in the table, the second unique index's build fails (23505)
// without waiting for the reader; under 00019 the first ALTER waited for it
// before that build, until lock_timeout (55P03).
func TestUniqueIndexesBuiltBeforeTheirConstraints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	mustExec(t, ctx, conn, `SELECT readmodel.create_generation('entries', 900), readmodel.drop_secondary_indexes('entries', 900)`)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.entries_g900
		(event_id, account_id, revision, type, reason, amount, currency, balance_after, idempotency_key, at, effective_at)
		SELECT gen_random_uuid(), 'acc', 1, 'credit', 'deposit', 1, 'EUR', 1, 'k' || i, now(), now() FROM generate_series(1, 2) i`)
	reader, err := connect(t, ctx, u).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	mustExec(t, ctx, reader.Conn(), `SELECT count(*) FROM readmodel.entries_g900`)
	mustExec(t, ctx, conn, `SET lock_timeout = '10s'`) // the old order waits that long, then fails
	_, err = conn.Exec(ctx, `SELECT readmodel.create_secondary_indexes('entries', 900)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerr.UniqueViolation || pgErr.ConstraintName != "entries_g900_account_id_revision_key" {
		t.Fatalf("create_secondary_indexes with a duplicate (account_id, revision) beside a reader: %v, want 23505 on entries_g900_account_id_revision_key", err)
	}
	// Its down step puts back 00019's function, and up again.
	reader.Rollback(ctx)
	if _, err := provider(t, u).DownTo(ctx, 19); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
