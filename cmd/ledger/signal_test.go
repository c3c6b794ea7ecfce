package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/migrations"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// SIGTERM ends `ledger audit` and `ledger replay` cleanly: the context is
// cancelled, they log where they stopped, write their profiles, store nothing
// and exit 3 ("stopped"). Each is caught mid-read: the test holds the events
// table locked, waits (a poll of pg_stat_activity) until the tool's read waits
// on that lock, and only then sends the signal.
func TestReadToolsStopCleanlyOnSIGTERM(t *testing.T) {
	url := pgtest.URL(t)
	if err := migrations.Up(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	env := []string{config.EnvDatabaseURL + "=" + url, config.EnvEventStoreURL + "=" + url}
	if out, stderr, code := runLedger(t, env, nil, "audit", "--log-level", "warn"); code != 0 {
		t.Fatalf("the audit of an empty ledger: exit %d:\n%s%s", code, out, stderr)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var before int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM readmodel.audit_checkpoints`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"audit"}, {"replay", "account-a"}} {
		profile := filepath.Join(t.TempDir(), "cpu.pprof")
		out := stopMidRead(t, conn, env, append(args, "--cpuprofile", profile))
		t.Logf("ledger %s after SIGTERM:\n%s", args[0], out)
		if !strings.Contains(out, args[0]+" stopped") {
			t.Fatalf("ledger %s after SIGTERM does not say it stopped:\n%s", args[0], out)
		}
		if st, err := os.Stat(profile); err != nil || st.Size() == 0 {
			t.Fatalf("ledger %s after SIGTERM: no CPU profile written (%v)", args[0], err)
		}
	}
	var after int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM readmodel.audit_checkpoints`).Scan(&after); err != nil || after != before {
		t.Fatalf("the stopped audit stored a checkpoint: %d, then %d (%v)", before, after, err)
	}
}

// stopMidRead runs ledger args while conn holds the events table locked,
// sends SIGTERM once the tool waits on the lock, and returns its output after
// checking that it exited 3.
func stopMidRead(t *testing.T, conn *pgx.Conn, env, args []string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(ledgerBinary(t), args...)
	run.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	devtest.Await(t, 2*time.Minute, func() error { // the lock's holder asks who waits on it
		select {
		case err := <-done:
			t.Fatalf("ledger %v ended (%v) before it read the events:\n%s", args, err, out.String())
		default:
		}
		var waiting int // a transaction reads one snapshot of the statistics unless cleared
		if err := tx.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()`).Scan(nil); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("ledger " + args[0] + " does not wait on the events table yet")
		}
		return nil
	})
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := <-done; !errors.As(err, &ee) || ee.ExitCode() != exitStopped {
		t.Fatalf("ledger %v after SIGTERM: %v, want exit status %d:\n%s", args, err, exitStopped, out.String())
	}
	return out.String()
}
