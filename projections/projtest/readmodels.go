package projtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/internal/app/audit"
)

// AuditOK audits store (internal/app/audit) with the hash chains verified
// and, given the read models' pool, every read model compared with the fold of
// the store; a violation fails t.
func AuditOK(t testing.TB, store audit.Store, readModels *pgxpool.Pool) *audit.Report {
	t.Helper()
	rep, err := audit.Run(context.Background(), store, audit.Options{ReadModels: readModels, VerifyChain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("audit: %d violations: %v", rep.ViolationCount, rep.Violations)
	}
	return rep
}

// Snapshot renders every read-model table in pool, by table.
func Snapshot(t testing.TB, pool *pgxpool.Pool) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, tables := range audit.ProjectionTables {
		for _, table := range tables {
			rows, err := audit.ReadTable(context.Background(), pool, table, 0, "")
			if err != nil {
				t.Fatal(err)
			}
			out[table] = rows
		}
	}
	return out
}

// SameSnapshot fails t, saying what changed the read models, where b's tables
// differ from a's.
func SameSnapshot(t testing.TB, what string, a, b map[string]map[string]string) {
	t.Helper()
	for table := range a {
		if d := audit.CompareTable(table, a[table], b[table]); !d.OK() {
			t.Fatalf("%s: %s", what, d.Describe(5))
		}
	}
}
