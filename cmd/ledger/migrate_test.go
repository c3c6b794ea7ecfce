package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// TestMigrateDownAndUpThroughTheBinary: `ledger migrate` applies this
// build's migrations, lists them, rolls back past the Go migration 00027
// (which goose's CLI over the SQL files cannot) to 00020, lists 00022 and
// up as pending, and applies them again; a negative --to is a usage error
// that rolls nothing back.
func TestMigrateDownAndUpThroughTheBinary(t *testing.T) {
	env := []string{config.EnvDatabaseURL + "=" + pgtest.URL(t), config.EnvDataDir + "=" + t.TempDir()}
	run := func(want int, args ...string) string {
		t.Helper()
		out, stderr, code := runLedger(t, env, nil, append([]string{"migrate"}, args...)...)
		if code != want {
			t.Fatalf("ledger migrate %s: exit %d, want %d:\n%s%s", strings.Join(args, " "), code, want, out, stderr)
		}
		return string(out)
	}
	pending := func(status string) (p []string) {
		for _, l := range strings.Split(strings.TrimSpace(status), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] == "pending" {
				p = append(p, f[0])
			}
		}
		return p
	}
	last := int64(0)
	for _, m := range migrationVersions(t) {
		last = max(last, m)
	}
	if p := pending(run(0, "up")); len(p) != 0 {
		t.Fatalf("pending after up: %v", p)
	}
	run(exitUsage, "down", "--to", "-1")
	if p := pending(run(0, "status")); len(p) != 0 {
		t.Fatalf("pending after a refused down: %v", p)
	}
	down := run(0, "down", "--to", "20")
	if !strings.Contains(down, "rolled back 00027") || !strings.Contains(down, fmt.Sprintf("rolled back %05d", last)) {
		t.Fatalf("down to 20 printed:\n%s", down)
	}
	if p := pending(run(0, "status")); len(p) == 0 || p[0] != "00022" || p[len(p)-1] != fmt.Sprintf("%05d", last) {
		t.Fatalf("pending after down to 20: %v", p)
	}
	if p := pending(run(0, "up")); len(p) != 0 {
		t.Fatalf("pending after up again: %v", p)
	}
}

// migrationVersions is this build's migration versions.
func migrationVersions(t *testing.T) []int64 {
	t.Helper()
	st, err := migrations.Status(t.Context(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]int64, len(st))
	for i, m := range st {
		v[i] = m.Source.Version
	}
	return v
}
