package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/projections"
)

// TestRebuildStoppedBySIGTERMResumesItsGeneration: `projector rebuild`
// (batches of 1000) sent SIGTERM once its accounts generation has committed
// a batch and waits on that generation's table, which the test holds from
// then until the signal is sent, exits 3 saying it stopped and leaves that
// generation being built at its checkpoint; the next rebuild resumes it
// from there, makes that same generation live and exits 0, no generation
// left being built.
func TestRebuildStoppedBySIGTERMResumesItsGeneration(t *testing.T) {
	ctx := context.Background()
	_, conn, penv := seededLedger(t, 20_000, seed.HistoryOptions{Accounts: 50})
	app := fmt.Sprintf("rebuildstop-%d", stops.Add(1))
	var tx pgx.Tx
	defer func() {
		if tx != nil {
			tx.Rollback(ctx)
		}
	}()
	args := []string{"rebuild", "--progress=false", "--batch-size", "1000"}
	out := stopWhenThen(t, projectorBinary(t), append(penv[:len(penv):len(penv)], "PGAPPNAME="+app), args, config.ExitStopped, func() error {
		if tx == nil {
			return holdBuilding(ctx, conn, &tx)
		}
		return waitsOnLock(ctx, tx, app)
	}, func() { tx.Rollback(ctx); tx = nil })
	if !strings.Contains(out, "projector stopped") {
		t.Fatalf("the stopped rebuild does not say it stopped:\n%s", out)
	}
	gen, events := building(t, conn)
	if events == 0 {
		t.Fatalf("accounts generation %d left at %d events: no batch kept to resume", gen, events)
	}
	out2, stderr, code := runProgram(t, projectorBinary(t), penv, nil, "rebuild", "--progress=false")
	resumed := fmt.Sprintf(`"rebuild: resuming" projection=accounts generation=%d `, gen)
	if code != 0 || !strings.Contains(stderr, resumed) || !strings.Contains(string(out2), fmt.Sprintf("-> %d:", gen)) {
		t.Fatalf("the next rebuild: exit %d, want 0 resuming accounts generation %d (at %d events) and making it live:\n%s%s", code, gen, events, out2, stderr)
	}
	var live, left int
	if err := conn.QueryRow(ctx, `SELECT (SELECT generation FROM readmodel.checkpoints WHERE name = $1 AND state = 'live'),
		(SELECT count(*) FROM readmodel.checkpoints WHERE state = 'building')`, projections.Accounts).Scan(&live, &left); err != nil || live != gen || left != 0 {
		t.Fatalf("after the resume: accounts generation %d live (want %d), %d generations being built (%v)", live, gen, left, err)
	}
}

// holdBuilding takes, in *tx, the table of the accounts generation being
// built once it has committed a batch: the build's next write waits on it.
func holdBuilding(ctx context.Context, conn *pgx.Conn, tx *pgx.Tx) error {
	var gen int
	if err := conn.QueryRow(ctx, `SELECT generation FROM readmodel.checkpoints WHERE name = $1 AND state = 'building' AND events > 0`, projections.Accounts).Scan(&gen); err != nil {
		return fmt.Errorf("no accounts generation with a batch committed yet: %w", err)
	}
	held, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := held.Exec(ctx, `LOCK TABLE `+projections.Table("accounts", gen)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		held.Rollback(ctx)
		return err
	}
	*tx = held
	return fmt.Errorf("accounts generation %d held: the rebuild does not wait on it yet", gen)
}

// building is the accounts generation being built and the events it has
// consumed; it fails the test unless there is exactly one.
func building(t *testing.T, conn *pgx.Conn) (gen int, events int64) {
	t.Helper()
	err := conn.QueryRow(context.Background(), `SELECT generation, events FROM readmodel.checkpoints WHERE name = $1 AND state = 'building'`, projections.Accounts).Scan(&gen, &events)
	if err != nil {
		t.Fatalf("no accounts generation left being built: %v", err)
	}
	return gen, events
}
