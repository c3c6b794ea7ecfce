package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditDropStop: `ledger audit --drop-stop` refuses bad input and flags
// that ask for an audit (exit 2, the stop point kept), a stop point not
// stored (exit 2), and one whose run's lock is held, as a resume of it
// holds it (exit 1, kept); then drops it by its ID with its run's schema,
// after which --resume finds none (exit 2); and one stored again by last
// (LEDGER_AUDIT_DROP_STOP).
func TestAuditDropStop(t *testing.T) {
	ctx := context.Background()
	env, conn, lenv := seededLedger(t, 400, seed.HistoryOptions{Accounts: 10})
	stop := stoppedAudit(t, env)
	id := fmt.Sprint(stop.ID)
	for _, c := range []struct {
		args []string
		code int
		said string
	}{
		{[]string{"--drop-stop", "0"}, 2, "a stop point's ID (1, 2, ...) or last"},
		{[]string{"--drop-stop", "x"}, 2, "a stop point's ID (1, 2, ...) or last"},
		{[]string{"--drop-stop", id, "--resume"}, 2, "not with --resume"},
		{[]string{"--drop-stop", id, "--from", "last"}, 2, "not with --from"},
		{[]string{"--drop-stop", fmt.Sprint(stop.ID + 1)}, 2, fmt.Sprintf("%d is not stored", stop.ID+1)},
	} {
		dropRefused(t, conn, lenv, stop, c.args, c.code, c.said)
	}
	var run string
	if err := conn.QueryRow(ctx, `SELECT sets FROM readmodel.audit_checkpoints WHERE id = $1`, stop.ID).Scan(&run); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('ledger audit sets ' || $1, 0))`, run); err != nil {
		t.Fatal(err)
	}
	dropRefused(t, conn, lenv, stop, []string{"--drop-stop", id}, 1, "an audit holds its sets (schema "+run+")")
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('ledger audit sets ' || $1, 0))`, run); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runLedger(t, lenv, nil, "audit", "--drop-stop", id, "--log-level", "warn")
	if want := fmt.Sprintf("stop point %d dropped, and its sets (schema %s)\n", stop.ID, run); code != 0 || string(out) != want {
		t.Fatalf("--drop-stop %s: exit %d, printed %q, want 0 and %q:\n%s", id, code, out, want, stderr)
	}
	if n := stopsLeft(t, conn); n != 0 {
		t.Fatalf("%d stop points left after --drop-stop", n)
	}
	if out, stderr, code := runLedger(t, lenv, nil, "audit", "--resume", "--log-level", "warn"); code != 2 || !strings.Contains(stderr, "no stop point is stored") {
		t.Fatalf("--resume after --drop-stop: exit %d, want 2 saying none is stored:\n%s%s", code, out, stderr)
	}
	stoppedAudit(t, env)
	if out, stderr, code := runLedger(t, append(lenv, "LEDGER_AUDIT_DROP_STOP=last"), nil, "audit", "--log-level", "warn"); code != 0 || stopsLeft(t, conn) != 0 {
		t.Fatalf("LEDGER_AUDIT_DROP_STOP=last: exit %d, %d stop points left:\n%s%s", code, stopsLeft(t, conn), out, stderr)
	}
	if out, stderr, code := runLedger(t, lenv, nil, "audit", "--drop-stop", "last", "--log-level", "warn"); code != 2 || !strings.Contains(stderr, "none is stored") {
		t.Fatalf("--drop-stop last with none stored: exit %d, want 2:\n%s%s", code, out, stderr)
	}
}

// stoppedAudit stores a real stop point: a full audit of env's history, in
// pages of 50 events, stopped by its context at its first page's end.
func stoppedAudit(t *testing.T, env *projtest.Env) *audit.StopRef {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, err := audit.Run(ctx, env.Store, audit.Options{Sets: env.Pool, BatchSize: 50, Progress: func(int64, int64) { cancel() }})
	if !errors.Is(err, audit.ErrStopped) || rep == nil || rep.Stop == nil {
		t.Fatalf("the audit stopped at its first page's end: %v, %+v", err, rep)
	}
	return rep.Stop
}

// dropRefused runs `ledger audit` args and wants exit code saying said, and
// stop still stored with its run's schema.
func dropRefused(t *testing.T, conn *pgx.Conn, env []string, stop *audit.StopRef, args []string, code int, said string) {
	t.Helper()
	out, stderr, got := runLedger(t, env, nil, append(append([]string{"audit"}, args...), "--log-level", "warn")...)
	if got != code || !strings.Contains(stderr, said) {
		t.Errorf("%v: exit %d, want %d saying %q:\n%s%s", args, got, code, said, out, stderr)
	}
	stopStored(t, conn, *stop)
}
