package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// TestBalanceKeyAfterLoadUpDown (migration 00031): drop_secondary_indexes
// leaves balance_history's primary key out of a generation being loaded,
// create_read_back_keys builds it (once: called again it does nothing) as
// create_secondary_indexes does, under create_generation's name and
// definition, and refuses a row loaded twice; going down, a generation being
// built without it gets it back (the earlier builder reads back by it), and
// drop_secondary_indexes keeps it again.
func TestBalanceKeyAfterLoadUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 31); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	key := func() string {
		var def string
		err := conn.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
			WHERE conrelid = 'readmodel.balance_history_g900'::regclass AND conname = 'balance_history_g900_pkey'`).Scan(&def)
		if errors.Is(err, pgx.ErrNoRows) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return def
	}
	const want = "PRIMARY KEY (account_id, revision)"
	mustExec(t, ctx, conn, `SELECT readmodel.create_generation('balances', 900)`)
	if k := key(); k != want {
		t.Fatalf("a generation made whole has key %q", k)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	if k := key(); k != "" {
		t.Fatalf("a generation being loaded has key %q", k)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.create_read_back_keys('balances', 900), readmodel.create_read_back_keys('balances', 900)`)
	if k := key(); k != want {
		t.Fatalf("create_read_back_keys built %q", k)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.balance_history_g900 (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
		SELECT 'acc', 0, gen_random_uuid(), 'opened', 'EUR', 0, 0, 'open', now(), now() FROM generate_series(1, 2)`)
	_, err := conn.Exec(ctx, `SELECT readmodel.create_read_back_keys('balances', 900)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerr.UniqueViolation {
		t.Fatalf("create_read_back_keys over a row loaded twice: %v, want 23505", err)
	}
	mustExec(t, ctx, conn, `DELETE FROM readmodel.balance_history_g900 WHERE ctid = (SELECT max(ctid) FROM readmodel.balance_history_g900)`)
	mustExec(t, ctx, conn, `SELECT readmodel.create_secondary_indexes('balances', 900)`)
	if k := key(); k != want {
		t.Fatalf("create_secondary_indexes built %q", k)
	}

	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.checkpoints (name, generation, state) VALUES ('balances', 900, 'building')`)
	if _, err := p.DownTo(ctx, 30); err != nil {
		t.Fatal(err)
	}
	if k := key(); k != want {
		t.Fatalf("down to 30: a generation being built has key %q", k)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	if k := key(); k != want {
		t.Fatalf("down to 30: drop_secondary_indexes left key %q", k)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
