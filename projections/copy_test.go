package projections

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestCopyOrUpsertStreamsItsRows: copyOrUpsert of no rows writes nothing
// and leaves the transaction usable (a COPY of none, its data a lone
// trailer, is refused by PostgreSQL and aborted the batch); rows of many
// COPY pieces are loaded whole, and a row already there falls back to the
// upsert; a row that cannot be written fails the write with its own error.
func TestCopyOrUpsertStreamsItsRows(t *testing.T) {
	ctx := context.Background()
	pool, gen := copyTestGeneration(t)
	rows := func(prefix string, n int, fail error) genRows {
		return testTransferRows(gen, n, func(c *pgcopy.Buf, i int) error {
			if fail != nil && i == n/2 {
				return fail
			}
			testTransferRow(c, prefix, i)
			return nil
		})
	}
	noFallback := func() error { t.Error("fell back to the upsert"); return nil }
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := copyOrUpsert(ctx, tx, rows("t", 0, nil), noFallback); err != nil {
			return fmt.Errorf("no rows: %w", err)
		}
		return copyOrUpsert(ctx, tx, rows("t", 30000, nil), noFallback) // some 60 pieces
	})
	if err != nil {
		t.Fatal(err)
	}
	var n, sum int64
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), sum(amount) FROM %s`, Table("transfers", gen))).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 30000 || sum != 30000*29999/2 {
		t.Fatalf("%d rows summing %d loaded, want 30000 summing %d", n, sum, 30000*29999/2)
	}
	fellBack := false
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return copyOrUpsert(ctx, tx, rows("t", 10, nil), func() error { fellBack = true; return nil })
	})
	if err != nil || !fellBack {
		t.Fatalf("rows there already: %v, fell back %v", err, fellBack)
	}
	boom := errors.New("boom")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return copyOrUpsert(ctx, tx, rows("u", 20000, boom), noFallback) })
	if !errors.Is(err, boom) {
		t.Fatalf("a row's error: %v", err)
	}
}

// copyTestGeneration opens a pool on a database of the test's own and
// creates a generation of transfers in it, dropped when the test ends.
func copyTestGeneration(t *testing.T) (*pgxpool.Pool, int) {
	t.Helper()
	bg := context.Background()
	pool, err := pgxpool.New(bg, devtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	gen, err := createGeneration(bg, pool, Transfers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dropGeneration(bg, pool, Transfers, gen) })
	return pool, gen
}

// testTransferRows are n rows of the transfers table of generation gen, each
// written by row.
func testTransferRows(gen, n int, row func(c *pgcopy.Buf, i int) error) genRows {
	return genRows{base: "transfers", gen: gen, columns: []string{"transfer_id", "from_account", "to_account", "amount", "currency", "status", "idempotency_key", "revision", "requested_at", "updated_at"}, n: n, row: row}
}

// testTransferRow writes the i-th transfers row, its ID prefix and i, its amount i.
func testTransferRow(c *pgcopy.Buf, prefix string, i int) {
	at := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)
	c.Text(fmt.Sprintf("%s-%07d", prefix, i)).Text("a").Text("b").Int8(int64(i)).Text("EUR").Text("pending").Text("k").Int8(0).Timestamptz(at).Timestamptz(at)
}
