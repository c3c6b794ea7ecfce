package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

// nonZero is badInput's want of a refusal whose exact code is not the
// program's: cli's own for an environment variable's value it cannot take.
const nonZero = -1

// badInput is a command line or environment the projector refuses.
type badInput struct {
	what string
	env  []string
	args []string
	code int      // the exit status (nonZero: any but 0)
	says []string // what its message names
}

// refused runs c and fails t unless it exits as c wants, its stderr
// naming what c says.
func (c badInput) refused(t *testing.T) {
	t.Helper()
	stdout, stderr, code := runProjector(t, c.env, c.args...)
	if code == 0 || (c.code != nonZero && code != c.code) {
		t.Errorf("%s (projector %s): exit %d, want %d:\n%s%s", c.what, strings.Join(c.args, " "), code, c.code, stdout, stderr)
		return
	}
	for _, s := range c.says {
		if !strings.Contains(stderr, s) {
			t.Errorf("%s (projector %s): its message does not name %q:\n%s", c.what, strings.Join(c.args, " "), s, stderr)
		}
	}
}

// TestBadInputIsRefusedAndWritesNothing: an unknown projection (by flag or
// environment), an index memory out of 0..65536 MiB (by flag or
// environment), a missing read-model database and an unknown command each
// make the projector exit non-zero (2, a usage error, for a command line)
// with a message naming what is wrong, and leave the read side as it was:
// no checkpoint, generation, table or view created or changed.
func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	url, conn := migrated(t)
	before := readSide(t, conn)
	env := storeEnv(url)
	noDB := []string{config.EnvEventStoreURL + "=" + url}
	unknown := `unknown projection "bogus"`
	quiet := []string{"--nats=false", "--publish=false", "--http-addr", ""}
	for _, c := range []badInput{
		{"an unknown projection to run", env, append([]string{"run", "--projection", "bogus"}, quiet...), config.ExitUsage, []string{unknown}},
		{"an unknown projection to rebuild", env, []string{"rebuild", "--progress=false", "--projection", "accounts", "--projection", "bogus"}, config.ExitUsage, []string{unknown}},
		{"a projection named twice to rebuild", env, []string{"rebuild", "--progress=false", "--projection", "accounts", "--projection", "accounts"}, config.ExitUsage, []string{`projection "accounts" named twice`}},
		{"an unknown projection to rebuild, from the environment", slices.Concat(env, []string{"LEDGER_PROJECTOR_PROJECTIONS=accounts,bogus"}), []string{"rebuild", "--progress=false"}, nonZero, []string{unknown}},
		{"an index memory over its bound", env, []string{"rebuild", "--progress=false", "--index-memory", "65537"}, config.ExitUsage, []string{"index-memory", "65537", "65536 MiB"}},
		{"an index memory below 0", env, []string{"rebuild", "--progress=false", "--index-memory", "-1"}, config.ExitUsage, []string{"index-memory", "-1", "65536 MiB"}},
		{"an index memory over its bound, from the environment", slices.Concat(env, []string{"LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY=70000"}), []string{"rebuild", "--progress=false"}, nonZero, []string{"LEDGER_PROJECTOR_REBUILD_INDEX_MEMORY", "70000", "65536 MiB"}},
		{"no database URL to run", noDB, append([]string{"run"}, quiet...), config.ExitUsage, []string{"no read-model database", "--database-url"}},
		{"no database URL to rebuild", noDB, []string{"rebuild", "--progress=false"}, config.ExitUsage, []string{"no read-model database", "--database-url"}},
		{"no database URL for the status", noDB, []string{"status"}, config.ExitUsage, []string{"no read-model database", "--database-url"}},
		{"an unknown command", env, []string{"rebiuld"}, config.ExitUsage, []string{`unknown command "rebiuld"`, "projector --help"}},
	} {
		c.refused(t)
		if after := readSide(t, conn); after != before {
			t.Fatalf("%s: the read side changed:\nbefore:\n%s\nafter:\n%s", c.what, before, after)
		}
	}
}

// TestRunRefusesAnUnknownProjectionBeforeMigrating: `projector run` (whose
// --migrate is on by default) given an unknown projection refuses it before
// it migrates a fresh database: no schema, no checkpoint, no generation.
func TestRunRefusesAnUnknownProjectionBeforeMigrating(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"bogus", `unknown projection "bogus"`},
		{"accounts", `projection "accounts" named twice`}, // review r506: run migrated, then refused it
	} {
		t.Run(c.name, func(t *testing.T) {
			url := pgtest.URL(t)
			conn := connect(t, url)
			badInput{"a projection list refused, to run on a fresh database", storeEnv(url),
				[]string{"run", "--projection", c.name, "--projection", "accounts", "--nats=false", "--publish=false", "--http-addr", ""},
				config.ExitUsage, []string{c.want}}.refused(t)
			var schema, goose *string
			if err := conn.QueryRow(context.Background(), `SELECT to_regnamespace('readmodel')::text, to_regclass('goose_db_version')::text`).Scan(&schema, &goose); err != nil {
				t.Fatal(err)
			}
			if schema != nil || goose != nil {
				t.Fatalf("the refused run wrote to the fresh database: schema %v, migrations table %v", deref(schema), deref(goose))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}
