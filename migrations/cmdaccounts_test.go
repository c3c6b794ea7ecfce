package migrations_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// TestUnwrittenCommandAccountsDroppedAtDown (migration 00032): going down,
// a commands generation being built past the start whose command_accounts is
// empty (rows held and never written: an earlier build would resume it without
// them) is dropped, table and checkpoint; one with its rows, one at the start,
// and another projection's are left to resume. Beside a rebuild (its lock
// held), the way down is refused.
func TestUnwrittenCommandAccountsDroppedAtDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 32); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	for _, g := range []struct {
		proj     string
		gen, pos int
		row      bool
	}{
		{"commands", 901, 5, false}, // unwritten: dropped
		{"commands", 902, 5, true},  // written
		{"commands", 903, 0, false}, // at the start
		{"accounts", 904, 5, false}, // not the commands'
	} {
		mustExec(t, ctx, conn, `SELECT readmodel.create_generation($1, $2)`, g.proj, g.gen)
		mustExec(t, ctx, conn, `INSERT INTO readmodel.checkpoints (name, generation, state, commit_position, prepare_position) VALUES ($1, $2, 'building', $3, $3)`, g.proj, g.gen, g.pos)
		if g.row {
			mustExec(t, ctx, conn, `INSERT INTO readmodel.command_accounts_g902 VALUES ('acc', 'EUR', 10, 3, 2)`)
		}
	}
	left := func() (gens []int) {
		rows, err := conn.Query(ctx, `SELECT generation FROM readmodel.checkpoints
			WHERE generation BETWEEN 901 AND 904 AND to_regclass(format('readmodel.%s_g%s', CASE name WHEN 'commands' THEN 'command_accounts' ELSE name END, generation)) IS NOT NULL
			ORDER BY generation`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var g int
			if err := rows.Scan(&g); err != nil {
				t.Fatal(err)
			}
			gens = append(gens, g)
		}
		return gens
	}

	lock := connect(t, ctx, u) // a rebuild running
	mustExec(t, ctx, lock, `SELECT pg_advisory_lock(x'6c6564676572'::bigint)`)
	_, err := p.DownTo(ctx, 31)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerr.LockNotAvailable {
		t.Fatalf("down beside a rebuild: %v, want 55P03", err)
	}
	if g := left(); !slices.Equal(g, []int{901, 902, 903, 904}) {
		t.Fatalf("down refused, generations left %v", g)
	}
	mustExec(t, ctx, lock, `SELECT pg_advisory_unlock(x'6c6564676572'::bigint)`)

	if _, err := p.DownTo(ctx, 31); err != nil {
		t.Fatal(err)
	}
	if g := left(); !slices.Equal(g, []int{902, 903, 904}) {
		t.Fatalf("down to 31: generations left %v, want 902, 903, 904", g)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
