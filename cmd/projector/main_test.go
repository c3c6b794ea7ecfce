package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// projectorBin is this command, built once per test binary: the program as
// a user runs it, Main's exit codes and signal handling with it.
var projectorBin = devtest.Program{Name: "projector", Package: "."}

func TestMain(m *testing.M) { os.Exit(devtest.RunPrograms(m)) }

// programTimeout bounds a run of the projector that should end by itself
// (a command that hangs fails its test instead of the whole test binary):
// 2 minutes killed a rebuild of 12 accounts at a load of 50 on 2 cores.
const programTimeout = 5 * time.Minute

// runProjector runs the projector with args and env (added to this
// process's, less the LEDGER_ variables a developer's shell may hold) to
// its end: its stdout, its stderr and its exit status. The program is built
// (the first call's go build) before programTimeout starts: under load the
// build alone took more than a run's bound (review r506).
func runProjector(t testing.TB, env []string, args ...string) (string, string, int) {
	t.Helper()
	bin := projectorBin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), programTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEDGER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("projector %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

// migrated is a fresh database with the migrations applied (each
// projection's first generation live): its URL and a connection to it.
func migrated(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	url := devtest.DatabaseURL(t)
	return url, connect(t, url)
}

// connect opens a connection to url, closed with the test.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// storeEnv points the projector at url for both its read models and its
// event store.
func storeEnv(url string) []string {
	return []string{config.EnvDatabaseURL + "=" + url, config.EnvEventStoreURL + "=" + url}
}

// readSide renders what a command may write on the read side: every
// checkpoint (projections' and the publisher's), every table of the
// readmodel schema and the views' definitions.
func readSide(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT 'checkpoint ' || name || ' g' || generation || ' ' || state || ' ' || commit_position || '/' || prepare_position || ' ' || events
		FROM readmodel.checkpoints
		UNION ALL SELECT 'publisher ' || name || ' ' || commit_position || ' ' || events FROM readmodel.publisher_checkpoints
		UNION ALL SELECT 'table ' || tablename FROM pg_tables WHERE schemaname = 'readmodel'
		UNION ALL SELECT 'view ' || viewname || ' ' || definition FROM pg_views WHERE schemaname = 'readmodel'
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestHelpListsEveryFlagWithItsEnvironmentVariable: every flag of the
// program and of each command has an environment variable (LEDGER_...), and
// the --help of each (and `help <command>`) prints every flag's name beside
// that variable, as the program's description promises.
func TestHelpListsEveryFlagWithItsEnvironmentVariable(t *testing.T) {
	app := newApp()
	paths := [][]string{{"--help"}, {"help"}}
	for _, c := range app.Commands {
		paths = append(paths, []string{c.Name, "--help"}, []string{"help", c.Name})
	}
	for _, p := range paths {
		stdout, stderr, code := runProjector(t, nil, p...)
		if code != 0 || !strings.Contains(stdout, "USAGE") {
			t.Errorf("projector %s: exit %d, printed no usage:\n%s%s", strings.Join(p, " "), code, stdout, stderr)
			continue
		}
		c := app
		if p[0] != "--help" && p[0] != "help" {
			c = app.Command(p[0])
		} else if len(p) == 2 && p[0] == "help" {
			c = app.Command(p[1])
		}
		if c == nil {
			t.Fatalf("projector %s: no such command", strings.Join(p, " "))
		}
		for _, f := range c.Flags {
			name := f.Names()[0]
			if name == "help" {
				continue
			}
			ev, ok := f.(interface{ GetEnvVars() []string })
			if !ok || len(ev.GetEnvVars()) == 0 {
				t.Errorf("projector %s --%s has no environment variable", c.Name, name)
				continue
			}
			for _, e := range ev.GetEnvVars() {
				if !strings.HasPrefix(e, "LEDGER_") {
					t.Errorf("projector %s --%s: variable %s does not start with LEDGER_", c.Name, name, e)
				}
				if !helpLineHas(stdout, "--"+name, "$"+e) {
					t.Errorf("projector %s: no line of its help names --%s and $%s:\n%s", strings.Join(p, " "), name, e, stdout)
				}
			}
		}
	}
}

// helpLineHas says whether one line of help holds both flag (as a whole
// word) and env.
func helpLineHas(help, flag, env string) bool {
	for _, line := range strings.Split(help, "\n") {
		fields := strings.Fields(strings.NewReplacer(",", " ", "[", " ", "]", " ").Replace(line))
		hasFlag, hasEnv := false, false
		for _, f := range fields {
			hasFlag = hasFlag || f == flag
			hasEnv = hasEnv || f == env
		}
		if hasFlag && hasEnv {
			return true
		}
	}
	return false
}
