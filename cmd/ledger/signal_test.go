package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// SIGTERM ends `ledger audit` and `ledger replay` cleanly: the context is
// cancelled, they log where they stopped, write their profiles, store nothing
// and exit 3 ("stopped"). Each is caught mid-read: the test holds the events
// table locked, waits (a poll of pg_stat_activity) until the tool's read waits
// on that lock, and only then sends the signal.
func TestReadToolsStopCleanlyOnSIGTERM(t *testing.T) {
	ctx := context.Background()
	env, conn := auditedLedger(t, 1)
	var before int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM readmodel.audit_checkpoints`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"audit"}, {"replay", "account-a"}} {
		profile := filepath.Join(t.TempDir(), "cpu.pprof")
		out := stopWaitingOn(t, conn, env, lockEvents, config.ExitStopped, append(args, "--cpuprofile", profile))
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

// lockEvents holds the events table: a read tool waits on it at its first read.
const lockEvents = `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`

// auditedLedger is a migrated, empty ledger on its own database, audited
// audits times (each storing a checkpoint): the ledger's environment and a
// connection to the database, closed with the test.
func auditedLedger(t *testing.T, audits int) ([]string, *pgx.Conn) {
	t.Helper()
	url := pgtest.URL(t)
	ctx := context.Background()
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	env := []string{config.EnvDatabaseURL + "=" + url, config.EnvEventStoreURL + "=" + url}
	for range audits {
		if out, stderr, code := runLedger(t, env, nil, "audit", "--log-level", "warn"); code != 0 {
			t.Fatalf("the audit of an empty ledger: exit %d:\n%s%s", code, out, stderr)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return env, conn
}

// seededLedger seeds a history of events events (o) into a new database
// and returns it, a connection to it, and the environment that points
// ledger (or projector) at it.
func seededLedger(t *testing.T, events int64, o seed.HistoryOptions) (*projtest.Env, *pgx.Conn, []string) {
	t.Helper()
	ctx := context.Background()
	env := projtest.New(t)
	if _, err := seed.History(ctx, env.Store, events, o); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return env, conn, []string{config.EnvDatabaseURL + "=" + env.URL, config.EnvEventStoreURL + "=" + env.URL}
}

// stopWaitingOn runs ledger args while conn holds what lock takes, sends
// SIGTERM once the tool waits on that lock, and returns its output after
// checking that it exited with code want.
func stopWaitingOn(t *testing.T, conn *pgx.Conn, env []string, lock string, want int, args []string) string {
	t.Helper()
	return stopWaitingOnIn(t, ledgerBinary(t), conn, env, lock, want, args)
}

// stopWaitingOnIn is stopWaitingOn of the program bin. Its connections are
// named (PGAPPNAME), so that only its own wait is seen: not one of an
// earlier program's, which the server ends only when it gets its lock.
func stopWaitingOnIn(t *testing.T, bin string, conn *pgx.Conn, env []string, lock string, want int, args []string) string {
	t.Helper()
	ctx := context.Background()
	app := fmt.Sprintf("stop-%d", stops.Add(1))
	env = append(env[:len(env):len(env)], "PGAPPNAME="+app)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, lock); err != nil {
		t.Fatal(err)
	}
	return stopWhen(t, bin, env, args, want, func() error { return waitsOnLock(ctx, tx, app) }) // the lock's holder asks who waits on it
}

// waitsOnLock says, asked in tx, whether a session of application app
// waits on a lock.
func waitsOnLock(ctx context.Context, tx pgx.Tx, app string) error {
	var waiting int // a transaction reads one snapshot of the statistics unless cleared
	if err := tx.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()`).Scan(nil); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND application_name = $1`, app).Scan(&waiting); err != nil {
		return err
	}
	if waiting == 0 {
		return errors.New(app + " does not wait on the lock yet")
	}
	return nil
}

// stops numbers stopWaitingOnIn's programs.
var stops atomic.Int64

// stopWhen runs bin args, sends SIGTERM once ready (polled) returns nil,
// and returns its output after checking that it exited with code want.
func stopWhen(t *testing.T, bin string, env, args []string, want int, ready func() error) string {
	t.Helper()
	return stopWhenThen(t, bin, env, args, want, ready, func() {})
}

// stopWhenThen is stopWhen that calls signalled once the signal is sent (a
// test there lets go of what held the program where the signal finds it).
func stopWhenThen(t *testing.T, bin string, env, args []string, want int, ready func() error, signalled func()) string {
	t.Helper()
	run := exec.Command(bin, args...)
	run.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	devtest.Await(t, 2*time.Minute, func() error {
		select {
		case err := <-done:
			t.Fatalf("%s %v ended (%v) before it was ready to stop:\n%s", filepath.Base(bin), args, err, out.String())
		default:
		}
		return ready()
	})
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled()
	var ee *exec.ExitError
	err := <-done
	if code := 0; (err == nil && want != 0) || (err != nil && (!errors.As(err, &ee) || ee.ExitCode() != want)) {
		if ee != nil {
			code = ee.ExitCode()
		}
		t.Fatalf("%s %v after SIGTERM: %v (exit %d), want exit status %d:\n%s", filepath.Base(bin), args, err, code, want, out.String())
	}
	return out.String()
}

// silentServer listens on a port that accepts connections and never
// answers (a PostgreSQL that hangs at connect): the URL, and a poll of
// whether a connection came.
func silentServer(t *testing.T) (string, func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "postgres://ledger:x@" + ln.Addr().String() + "/ledger?sslmode=disable", func() error {
		if accepted.Load() == 0 {
			return errors.New("no connection yet")
		}
		return nil
	}
}

// TestStoppedCommandsExit3WhereverTheStopLands: `ledger audit`, `ledger
// replay` and `projector rebuild`, stopped by SIGTERM while they connect to
// the database (a server that never answers), while their migrations check
// waits (goose's table locked) or in their work (the events table locked),
// exit 3 and log that they stopped. On bde2e73 the first two exited 2 (the
// migrations check's refusal), a stopped rebuild's work 1, and none logged
// "<program> stopped".
func TestStoppedCommandsExit3WhereverTheStopLands(t *testing.T) {
	env, conn := auditedLedger(t, 0)
	for _, c := range []struct {
		bin  string
		args []string
	}{
		{ledgerBinary(t), []string{"audit"}},
		{ledgerBinary(t), []string{"replay", "account-a"}},
		{projectorBinary(t), []string{"rebuild", "--progress=false"}},
	} {
		said := func(t *testing.T, out string) {
			if !strings.Contains(out, filepath.Base(c.bin)+" stopped") {
				t.Fatalf("%v after SIGTERM does not say it stopped:\n%s", c.args, out)
			}
		}
		t.Run(c.args[0]+"/connecting", func(t *testing.T) {
			silent, connected := silentServer(t)
			said(t, stopWhen(t, c.bin, []string{config.EnvDatabaseURL + "=" + silent, config.EnvEventStoreURL + "=" + silent}, c.args, config.ExitStopped, connected))
		})
		t.Run(c.args[0]+"/migrations check", func(t *testing.T) {
			said(t, stopWaitingOnIn(t, c.bin, conn, env, `LOCK TABLE goose_db_version IN ACCESS EXCLUSIVE MODE`, config.ExitStopped, c.args))
		})
		t.Run(c.args[0]+"/work", func(t *testing.T) {
			said(t, stopWaitingOnIn(t, c.bin, conn, env, lockEvents, config.ExitStopped, c.args))
		})
	}
}

// An audit stopped after its checkpoint's save committed (SIGTERM while it
// drops the oldest checkpoints, waiting on a row the test holds) has stored
// its checkpoint: it prints its verdict and the checkpoint's ID and digest,
// which the next --from needs, and exits 0, rather than saying nothing was
// stored (a reviewer of 5f70999: "exit 3; checkpoints before 3, after 4").
func TestAuditStoppedAfterItsCheckpointSavedPrintsIt(t *testing.T) {
	ctx := context.Background()
	env, conn := auditedLedger(t, projections.AuditCheckpointsKept)
	out := stopWaitingOn(t, conn, env, `SELECT id FROM readmodel.audit_checkpoints ORDER BY id LIMIT 1 FOR UPDATE`, 0, []string{"audit", "--json"})
	var id int64
	if err := conn.QueryRow(ctx, `SELECT max(id) FROM readmodel.audit_checkpoints`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if id != int64(projections.AuditCheckpointsKept)+1 {
		t.Fatalf("the newest checkpoint is %d, want %d: the audit did not store one before the signal", id, projections.AuditCheckpointsKept+1)
	}
	if !strings.Contains(out, `"checkpoint"`) || !strings.Contains(out, `"digest"`) || (!strings.Contains(out, fmt.Sprintf(`"id": %d`, id)) && !strings.Contains(out, fmt.Sprintf(`"id":%d`, id))) {
		t.Fatalf("the audit stored checkpoint %d and does not print it:\n%s", id, out)
	}
}

// TestSignalAfterTheAuditVerdictKeepsExit1: a SIGTERM that lands once the
// audit found its violations and writes its report (to a pipe the test reads
// slowly: 3000 forged read-model accounts make a report over the pipe's 64
// KiB) leaves the verdict's exit 1, not 3 ("stopped, no verdict: run it
// again"), which a cron wrapper would take for "retry later". On main before
// this change it exited 3 (config.ExitStatus made any error after a stop 3).
func TestSignalAfterTheAuditVerdictKeepsExit1(t *testing.T) {
	ctx := context.Background()
	env, conn := auditedLedger(t, 0)
	var table string
	if err := conn.QueryRow(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'readmodel' AND tablename LIKE 'accounts_g%' ORDER BY tablename LIMIT 1`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO readmodel.%s (account_id, currency, overdraft_limit, status, balance, held, revision, opened_at, updated_at)
		SELECT 'forged-' || i, 'EUR', 0, 'open', 100, 0, 0, now(), now() FROM generate_series(1, 3000) i`, table)); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	run := exec.Command(ledgerBinary(t), "audit", "--json", "--progress=false")
	run.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	run.Stdout, run.Stderr = pw, &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	first := make([]byte, 1)
	if _, err := io.ReadFull(pr, first); err != nil { // the verdict is being written: audit.Run returned
		t.Fatalf("no report: %v\n%s", err, stderr.String())
	}
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(pr)
	if err != nil {
		t.Fatal(err)
	}
	err = run.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("an audit that found violations, signalled while it wrote them: %v, want exit status 1:\n%s", err, stderr.String())
	}
	if out := string(first) + string(rest); !strings.Contains(out, "read_model_mismatch") || !strings.Contains(out, "forged-1") {
		t.Fatalf("the report (%d bytes) does not name the forged accounts: %.300s", len(out), out)
	}
}
