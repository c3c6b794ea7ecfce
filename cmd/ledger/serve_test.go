package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// databaseWithPassword is a fresh database whose URL holds a password, and that
// password: the private cluster's (scram-sha-256), or one that trust
// authentication ignores on a LEDGER_TEST_DATABASE_URL without one.
func databaseWithPassword(t *testing.T) (dbURL, password string) {
	t.Helper()
	db, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	password, ok := db.User.Password()
	if !ok || password == "" {
		password = "s3cret-pw"
		db.User = url.UserPassword(db.User.Username(), password)
	}
	return db.String(), password
}

// `ledger serve` on an external NATS and PostgreSQL: applies the migrations, takes
// commands, never logs a password, and stops cleanly on SIGTERM.
func TestServe(t *testing.T) {
	ns := devtest.NATS(t)
	dbURL, password := databaseWithPassword(t)
	httpPort := freePort(t)
	cmd := exec.Command(ledgerBinary(t), "serve", "--log-format", "json", "--jetstream-grace", "100ms")
	cmd.Env = append(os.Environ(),
		config.EnvNATSURL+"="+ns.ClientURL(),
		config.EnvDatabaseURL+"="+dbURL,
		config.EnvHTTPAddr+"="+fmt.Sprintf("127.0.0.1:%d", httpPort),
	)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	devtest.Eventually(t, time.Minute, "serve ready", func() bool {
		return strings.Contains(out.String(), "intake started")
	})

	env := []string{config.EnvNATSURL + "=" + ns.ClientURL(), config.EnvDataDir + "=" + t.TempDir()}
	if r, o, code := postCLI(t, env, "open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
		t.Fatalf("open_account: exit %d\n%s", code, o)
	}
	if r, o, code := postCLI(t, env, "deposit", "--key", "d-1", "--account", "a", "--amount", "250", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
		t.Fatalf("deposit: exit %d\n%s", code, o)
	}
	if r, o, code := postCLI(t, env, "--query", "--key", "d-1"); code != 0 || r["idempotency_key"] != "d-1" {
		t.Fatalf("query: exit %d\n%s", code, o)
	}
	if r, o, code := postCLI(t, env, "deposit", "--key", "d-2", "--json", `{"idempotency_key":"d-2","account_id":"a","amount":1.5,"currency":"EUR"}`); code != exitAnswered || r["code"] != "invalid_request" {
		t.Fatalf("invalid deposit: exit %d\n%s", code, o)
	}
	if _, o, code := postCLI(t, env, "deposit", "--account", "a"); code != exitUsage {
		t.Fatalf("post without --key: exit %d\n%s", code, o)
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v:\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("serve did not stop:\n%s", out.String())
	}
	logs := out.String()
	if strings.Contains(logs, password) {
		t.Fatalf("a password reached the log:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"stopped"`) || !bytes.Contains([]byte(logs), []byte("xxxxx@")) {
		t.Fatalf("log lacks the clean stop or the redacted URL:\n%s", logs)
	}
}

// `ledger dev --nats-auth`: the embedded NATS server refuses a client without
// the generated user and password; `ledger post` finds them in dev.json (mode
// 0600) and gets its answer; the log (at debug) never holds the password, nor the
// private cluster's.
func TestDevNATSAuth(t *testing.T) {
	dir := t.TempDir()
	dev := startDev(t, dir, []string{"--nats-addr", "127.0.0.1:0", "--nats-auth", "--log-level", "debug"}, nil)
	u, err := url.Parse(dev.info.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	password, ok := u.User.Password()
	if !ok || len(password) < 32 {
		t.Fatalf("dev.json's NATS URL carries no generated password: %s", config.Redact(dev.info.NATSURL))
	}
	fi, err := os.Stat(filepath.Join(dir, "dev.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev.json: %v %v", err, fi.Mode())
	}
	bare := *u
	bare.User = nil
	if nc, err := nats.Connect(bare.String()); err == nil {
		nc.Close()
		t.Fatal("a client without credentials got in")
	}
	env := []string{config.EnvDataDir + "=" + dir}
	if r, o, code := postCLI(t, env, "open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
		t.Fatalf("open_account through dev.json: exit %d\n%s", code, o)
	}
	wrong := append(env, config.EnvNATSURL+"="+bare.String(), config.EnvNATSUser+"=ledger", config.EnvNATSPassword+"=not-the-password")
	if _, o, code := postCLI(t, wrong, "deposit", "--key", "d-1", "--account", "a", "--amount", "1", "--currency", "EUR"); code != exitNoReply ||
		!strings.Contains(o, "auth: user ledger with a password") || strings.Contains(o, "not-the-password") {
		t.Fatalf("a wrong password: exit %d, want %d with the mode named and no secret:\n%s", code, exitNoReply, o)
	}
	dev.stop()
	logs := dev.out.String()
	pgPassword, _ := os.ReadFile(filepath.Join(dir, "postgres", "superuser.password"))
	noSecret(t, "ledger dev", logs, password, strings.TrimSpace(string(pgPassword)))
	if !strings.Contains(logs, "nats-server ready") || !strings.Contains(logs, "level=DEBUG") {
		t.Fatalf("the log at debug lacks the server's start or any debug line (the test would pass vacuously):\n%s", logs)
	}
}

// `ledger dev --pprof --memprofile --cpuprofile`: the heap profile is served on
// demand while it runs, and SIGTERM leaves both profiles written (gzipped
// profile.proto naming their sample types).
func TestDevProfiles(t *testing.T) {
	dir := t.TempDir()
	heapFile, cpuFile := filepath.Join(dir, "dev.heap"), filepath.Join(dir, "dev.cpu")
	dev := startDev(t, dir, nil, []string{"LEDGER_PPROF=true", config.EnvMemProfile + "=" + heapFile, config.EnvCPUProfile + "=" + cpuFile})
	resp, err := http.Get(dev.info.HTTPURL + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap profile:") {
		t.Fatalf("/debug/pprof/heap answered %d:\n%.300s", resp.StatusCode, body)
	}
	dev.stop()
	for file, sampleType := range map[string]string{heapFile: "inuse_space", cpuFile: "nanoseconds"} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatalf("profile not written: %v\n%s", err, dev.out.String())
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		proto, err := io.ReadAll(zr)
		f.Close()
		if err != nil || !bytes.Contains(proto, []byte(sampleType)) {
			t.Fatalf("%s: %d bytes, err %v, no sample type %q", file, len(proto), err, sampleType)
		}
	}
}

// TestServeWhoseDrainFailsExits1: `ledger serve` signalled while a command
// is in flight (blocked on its account stream's lock, an advisory lock the
// event store takes before it appends, which the test holds until serve has
// exited) cannot drain within --shutdown-timeout: it exits 1
// (a failed stop), not 3 ("stopped, run it again": the status of a command a
// stop cut short) nor 0. On main before config.ExitStatus's verdict rule it
// exited 3.
func TestServeWhoseDrainFailsExits1(t *testing.T) {
	ctx := context.Background()
	ns := devtest.NATS(t)
	dbURL := pgtest.URL(t)
	serve := startProc(t, ledgerBinary(t), []string{"serve", "--log-format", "json", "--jetstream-grace", "100ms", "--http-addr", anyPort, "--shutdown-timeout", "200ms"},
		[]string{config.EnvNATSURL + "=" + ns.ClientURL(), config.EnvDatabaseURL + "=" + dbURL, "PGAPPNAME=drained-serve"}, "intake started")
	env := []string{config.EnvNATSURL + "=" + ns.ClientURL(), config.EnvDataDir + "=" + t.TempDir()}
	if r, o, code := postCLI(t, env, "open_account", "--key", "o-1", "--account", "a", "--currency", "EUR"); code != 0 || r["status"] != "applied" {
		t.Fatalf("open_account: exit %d\n%s", code, o)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // after serve's exit: its command stays in flight until then
	// Not the events table: the transfer process's reads would wait on it too.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('account-a', 0))`); err != nil {
		t.Fatal(err)
	}
	post := exec.Command(ledgerBinary(t), "post", "deposit", "--key", "d-1", "--account", "a", "--amount", "250", "--currency", "EUR")
	post.Env = append(os.Environ(), env...)
	if err := post.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = post.Process.Kill(); _ = post.Wait() })
	devtest.Eventually(t, time.Minute, "the deposit waits on account-a's lock", func() bool {
		var waiting int
		if err := tx.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()`).Scan(nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND application_name = 'drained-serve'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
	_ = serve.cmd.Process.Signal(syscall.SIGTERM)
	<-serve.done
	var ee *exec.ExitError
	if !errors.As(serve.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("serve whose drain failed: %v, want exit status 1:\n%s", serve.err, serve.out.String())
	}
}
