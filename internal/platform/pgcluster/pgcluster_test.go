package pgcluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/config"
)

func testDir(t *testing.T) string {
	t.Helper()
	// Not t.TempDir: its path under /tmp/Test<Name>... is long, and it would be
	// removed before a server still running in it is stopped.
	dir, err := os.MkdirTemp("", "pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, c.Stop)
	return c
}

// stopOnCleanup stops a cluster or a pair when the test ends.
func stopOnCleanup(t *testing.T, stop func(context.Context) error) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := stop(ctx); err != nil {
			t.Error(err)
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func exec1(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	c := start(t, Options{Dir: dir})
	if !strings.Contains(c.URL(), "/ledger?") || c.Port() == 0 {
		t.Fatalf("URL %q port %d", c.URL(), c.Port())
	}
	if got := query(t, c.URL(), "SELECT current_database()"); got != Database {
		t.Fatalf("current_database = %q", got)
	}
	if got := query(t, c.URL(), "SHOW fsync"); got != "off" {
		t.Fatalf("fsync = %q, want off", got)
	}
	if got := query(t, c.URL(), "SHOW max_connections"); got != "200" {
		t.Fatalf("max_connections = %q", got)
	}
	if got := query(t, c.URL(), "SHOW listen_addresses"); got != "127.0.0.1" {
		t.Fatalf("listen_addresses = %q", got)
	}
	if os.Geteuid() == 0 {
		if got := query(t, c.URL(), "SELECT current_setting('data_directory')"); got != filepath.Join(dir, "data") {
			t.Fatalf("data_directory = %q", got)
		}
		fi, err := os.Stat(filepath.Join(dir, "data"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Sys().(*syscall.Stat_t).Uid == 0 {
			t.Fatal("data directory is owned by root")
		}
	}
	// Mark the cluster so the restart can be shown to keep its data.
	exec1(t, c.URL(), "CREATE TABLE marker AS SELECT 'kept' AS v")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	c2 := start(t, Options{Dir: dir, Fsync: true})
	if got := query(t, c2.URL(), "SELECT v FROM marker"); got != "kept" {
		t.Fatalf("marker = %q", got)
	}
	if got := query(t, c2.URL(), "SHOW fsync"); got != "on" {
		t.Fatalf("fsync = %q, want on", got)
	}
	if got := query(t, c2.URL(), "SHOW synchronous_commit"); got != "on" {
		t.Fatalf("synchronous_commit = %q, want on", got)
	}
	// A durable cluster checkpoints as docs/operations.md recommends.
	if got := query(t, c2.URL(), "SHOW max_wal_size"); got != "8GB" {
		t.Fatalf("max_wal_size = %q, want 8GB", got)
	}
	if got := query(t, c2.URL(), "SHOW checkpoint_completion_target"); got != "0.9" {
		t.Fatalf("checkpoint_completion_target = %q, want 0.9", got)
	}
	if got := query(t, c2.URL(), "SHOW backend_flush_after"); got != "256kB" {
		t.Fatalf("backend_flush_after = %q, want 256kB", got)
	}
}

// TestReuseRunning is the parent-killed case: the server of a previous Start still
// runs, and a new Start on the same Dir reuses it.
func TestReuseRunning(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	c := start(t, Options{Dir: dir})
	pid := postmasterPID(t, dir)
	c2 := start(t, Options{Dir: dir})
	if c2.Port() != c.Port() || postmasterPID(t, dir) != pid {
		t.Fatalf("not reused: port %d→%d, pid %d→%d", c.Port(), c2.Port(), pid, postmasterPID(t, dir))
	}
	if got := query(t, c2.URL(), "SELECT 'ok'"); got != "ok" {
		t.Fatal(got)
	}
}

// TestStalePIDFile: the server died without cleaning up (SIGKILL), and its PID now
// belongs to another process of the same user: the postmaster itself would refuse
// to start ("lock file already exists"), Start must recognise the file as stale.
func TestStalePIDFile(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	c := start(t, Options{Dir: dir})
	pid := postmasterPID(t, dir)
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait until the postmaster is gone (its children notice and exit as well).
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("postmaster did not die")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A live process of the server's user takes the PID's place in the file.
	sleeper := exec.Command("sleep", "60")
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			t.Fatal(err)
		}
		sleeper.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	lines := strings.SplitN(string(pidFile), "\n", 2)
	fake := strconv.Itoa(sleeper.Process.Pid) + "\n" + lines[1]
	if err := os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(fake), 0o600); err != nil {
		t.Fatal(err)
	}

	c2 := start(t, Options{Dir: dir, Port: c.Port()})
	if got := query(t, c2.URL(), "SELECT 'ok'"); got != "ok" {
		t.Fatal(got)
	}
	if postmasterPID(t, dir) == sleeper.Process.Pid {
		t.Fatal("pid file still names the sleeper")
	}
}

func TestLongDirUsesTCPOnly(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testDir(t), strings.Repeat("d", 100))
	c := start(t, Options{Dir: dir})
	if got := query(t, c.URL(), "SHOW unix_socket_directories"); got != "" {
		t.Fatalf("unix_socket_directories = %q, want empty", got)
	}
}

func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(fmt.Errorf("postmaster.pid: %w", err))
	}
	return pid
}

// TestConcurrentStart: two Starts on one Dir at once (two `ledger dev`) both get
// the one server.
func TestConcurrentStart(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type res struct {
		c   *Cluster
		err error
	}
	out := make(chan res, 2)
	for range 2 {
		go func() {
			c, err := Start(ctx, Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
			out <- res{c, err}
		}()
	}
	a, b := <-out, <-out
	if a.err != nil || b.err != nil {
		t.Fatalf("starts: %v, %v", a.err, b.err)
	}
	t.Cleanup(func() { a.c.Stop(context.Background()) })
	if a.c.Port() != b.c.Port() {
		t.Fatalf("two servers: ports %d and %d", a.c.Port(), b.c.Port())
	}
	if got := query(t, b.c.URL(), "SELECT 'ok'"); got != "ok" {
		t.Fatal(got)
	}
}

// connectErr tries a connection and returns its error.
func connectErr(t *testing.T, url string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		conn.Close(ctx)
	}
	return err
}

// withPassword is the cluster's URL with another password.
func withPassword(c *Cluster, pw string) string {
	saved := c.pw
	c.pw = pw
	defer func() { c.pw = saved }()
	return c.URL()
}

// TestPasswordAuthentication: the cluster asks for the superuser's password
// (scram-sha-256), kept in a 0600 file and in the URL; a connection without it
// or with another one is refused; nothing Start logs holds it, and the URL's
// redacted form neither.
func TestPasswordAuthentication(t *testing.T) {
	dir := testDir(t)
	var logs strings.Builder
	c := start(t, Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	fi, err := os.Stat(filepath.Join(dir, pwName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("password file: %v, mode %v", err, fi.Mode())
	}
	if len(c.pw) < 32 || !strings.Contains(c.URL(), c.pw) {
		t.Fatalf("URL %q does not carry the password", c.URL())
	}
	if err := connectErr(t, c.URL()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "wrong"} {
		if err := connectErr(t, withPassword(c, bad)); err == nil || !strings.Contains(err.Error(), "password") {
			t.Fatalf("password %q: %v, want an authentication failure", bad, err)
		}
	}
	if q := query(t, c.URLFor("postgres"), "SELECT (rolpassword LIKE 'SCRAM-SHA-256$%')::text FROM pg_authid WHERE rolname = 'postgres'"); q != "true" {
		t.Fatalf("stored password is not a SCRAM verifier: %s", q)
	}
	if strings.Contains(logs.String(), c.pw) {
		t.Fatal("Start logged the password")
	}
	if strings.Contains(config.Redact(c.URL()), c.pw) {
		t.Fatal("the redacted URL holds the password")
	}
}

// TestTrustClusterIsSecured: a cluster made before passwords (trust
// authentication, no password file) asks for one after the next Start.
func TestTrustClusterIsSecured(t *testing.T) {
	dir := testDir(t)
	c := start(t, Options{Dir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	trust := "local all all trust\nhost all all 127.0.0.1/32 trust\n"
	if err := c.writeOwned(filepath.Join(dir, dataSubdir, "pg_hba.conf"), trust); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, pwName)); err != nil {
		t.Fatal(err)
	}
	c2 := start(t, Options{Dir: dir})
	if c2.pw == c.pw {
		t.Fatal("no new password")
	}
	if err := connectErr(t, c2.URL()); err != nil {
		t.Fatal(err)
	}
	if err := connectErr(t, withPassword(c2, "")); err == nil {
		t.Fatal("a connection without the password got in after the upgrade")
	}
}
