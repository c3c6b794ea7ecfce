package audit_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// runSchemas lists the schemas of audits' runs, with whether each one's
// audit_ids is UNLOGGED.
func runSchemas(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT n.nspname, coalesce(c.relpersistence = 'u', false)
		FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'audit_ids'
		WHERE n.nspname LIKE 'audit\_sets\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var name string
	var unlogged bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &unlogged}, func() error { out[name] = unlogged; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFullAuditKeepsItsSetsInARunSchema: while a full audit folds, its sets
// are UNLOGGED tables of one schema of its run; the audit drops it when it
// ends. An incremental audit's stay TEMP.
func TestFullAuditKeepsItsSetsInARunSchema(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	var during []map[string]bool
	opts := audit.Options{BatchSize: 7, SaveCheckpoint: true, Progress: func(int64, int64) { during = append(during, runSchemas(t, env.Pool)) }}
	rep := run(t, env, opts)
	if !rep.OK() || rep.Checkpoint == nil {
		t.Fatalf("a clean full audit: %v, checkpoint %v", rep.Violations, rep.Checkpoint)
	}
	if len(during) < 2 {
		t.Fatalf("%d pages seen", len(during))
	}
	for i, s := range during {
		if len(s) != 1 {
			t.Fatalf("page %d: run schemas %v, want one", i, s)
		}
		for name, unlogged := range s {
			if !unlogged || name != firstKey(during[0]) {
				t.Fatalf("page %d: %s (audit_ids UNLOGGED: %v), first seen %v", i, name, unlogged, during[0])
			}
		}
	}
	if s := runSchemas(t, env.Pool); len(s) != 0 {
		t.Fatalf("run schemas left after the audit: %v", s)
	}
	during = nil
	from := rep.Checkpoint.ID
	opts.From, opts.SaveCheckpoint = &from, false
	if rep := run(t, env, opts); !rep.OK() {
		t.Fatalf("incremental: %v", rep.Violations)
	}
	for i, s := range during {
		if len(s) != 0 {
			t.Fatalf("incremental audit, page %d: run schemas %v", i, s)
		}
	}
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

// TestPlainAuditDropsTheRunsLeftBehind: a full audit, and an incremental
// one, drops the schemas of runs no audit holds (one killed by SIGKILL) and
// no stop point names, and leaves a held run's and a stop point's.
func TestPlainAuditDropsTheRunsLeftBehind(t *testing.T) {
	for _, incremental := range []bool{false, true} {
		t.Run(map[bool]string{false: "full", true: "incremental"}[incremental], func(t *testing.T) {
			dropsTheRunsLeftBehind(t, incremental)
		})
	}
}

// dropsTheRunsLeftBehind is TestPlainAuditDropsTheRunsLeftBehind of a full
// audit or, incremental, of one from a checkpoint.
func dropsTheRunsLeftBehind(t *testing.T, incremental bool) {
	env := projected(t, projtest.Workload{Commands: 30, Seed: 3})
	ctx := context.Background()
	var opts audit.Options
	if incremental {
		first := run(t, env, audit.Options{SaveCheckpoint: true})
		if first.Checkpoint == nil {
			t.Fatalf("no checkpoint stored: %v", first.Violations)
		}
		opts.From = &first.Checkpoint.ID
	}
	orphan, held, stopped := runName(), runName(), runName()
	for _, s := range []string{orphan, held, stopped} {
		if _, err := env.Pool.Exec(ctx, `CREATE SCHEMA `+s+`; CREATE UNLOGGED TABLE `+s+`.audit_ids (event_id uuid NOT NULL, seq bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := env.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('ledger audit sets ' || $1, 0))`, held); err != nil {
		t.Fatal(err)
	}
	none := func() (projections.AuditAccount, bool, error) { return projections.AuditAccount{}, false, nil }
	save := projections.AuditSave{Checkpoint: projections.AuditCheckpoint{Position: eventstore.Position{Commit: 1, Prepare: 1}, State: []byte(`{}`)}, Next: none}
	if _, _, err := projections.Checkpoints.SaveAuditStop(ctx, env.Pool, save, stopped); err != nil {
		t.Fatal(err)
	}
	if rep := run(t, env, opts); !rep.OK() {
		t.Fatalf("violations: %v", rep.Violations)
	}
	left := runSchemas(t, env.Pool)
	if _, ok := left[orphan]; ok {
		t.Fatalf("the run no audit holds and no stop point names is left: %v", left)
	}
	if _, ok := left[held]; !ok {
		t.Fatalf("the run an audit holds was dropped: %v", left)
	}
	if _, ok := left[stopped]; !ok || len(left) != 2 {
		t.Fatalf("left %v, want the held run %s and the stop point's %s", left, held, stopped)
	}
}

func runName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "audit_sets_" + hex.EncodeToString(b[:])
}

// TestAuditWithoutCreateKeepsTempSets: a role without CREATE on the database
// (TEMPORARY only, as PUBLIC has by default) audits as before, its sets in
// its session's TEMP tables, and the log says they are not resumable.
func TestAuditWithoutCreateKeepsTempSets(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	sets := poolAsRoleWithoutCreate(t, env)
	var log bytes.Buffer
	var during []map[string]bool
	opts := audit.Options{BatchSize: 7, Sets: sets, Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Progress: func(int64, int64) { during = append(during, runSchemas(t, env.Pool)) }}
	rep := run(t, env, opts)
	want := run(t, env, audit.Options{BatchSize: 7})
	if !rep.OK() || rep.Events != want.Events || rep.Keys != want.Keys || len(rep.ReadModels) != len(want.ReadModels) {
		t.Fatalf("the audit with TEMP sets: %d events, %d keys, %v; with a run's: %d, %d", rep.Events, rep.Keys, rep.Violations, want.Events, want.Keys)
	}
	for i, s := range during {
		if len(s) != 0 {
			t.Fatalf("page %d: run schemas %v for a role without CREATE", i, s)
		}
	}
	if !strings.Contains(log.String(), "TEMP tables") || !strings.Contains(log.String(), "no stop point") {
		t.Fatalf("the log does not say the sets are not resumable:\n%s", log.String())
	}
}

// poolAsRoleWithoutCreate is a pool of env's database whose sessions act as a
// new role without CREATE on it, dropped when t ends.
func poolAsRoleWithoutCreate(t *testing.T, env *projtest.Env) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := "nocreate_" + strings.TrimPrefix(runName(), "audit_sets_")
	if _, err := env.Pool.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	cfg := env.Pool.Config().Copy()
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+role)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if _, err := env.Pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
			t.Error(err)
		}
	})
	var canCreate bool
	if err := pool.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&canCreate); err != nil || canCreate {
		t.Fatalf("role %s may create in the database (%v)", role, err)
	}
	return pool
}
