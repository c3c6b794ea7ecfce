package audit_test

import (
	"context"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestFullAuditNamesAWrongEntryAndBalanceHistoryRow: a full audit compares
// entries and balance_history by the sums of their rows' hashes and holds
// their expected rows out of its sets until a sum differs (heldrows.go); an
// entry and a balance-history row edited, each of another event, are each
// named as differing, in its table alone, as the join over the sets names
// them.
func TestFullAuditNamesAWrongEntryAndBalanceHistoryRow(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	opts := audit.Options{BatchSize: 7} // the rows held across pages
	if rep := run(t, env, opts); !rep.OK() {
		t.Fatalf("violations before the edits: %v", rep.Violations)
	}
	rows, err := env.Pool.Query(context.Background(), `SELECT event_id::text FROM events WHERE type = 'Credited' ORDER BY position LIMIT 2`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if len(ids) != 2 {
		t.Fatalf("%d credits", len(ids))
	}
	exec(t, env, `UPDATE readmodel.entries SET amount = amount + 1 WHERE event_id = $1`, ids[0])
	exec(t, env, `UPDATE readmodel.balance_history SET balance = balance + 1 WHERE event_id = $1`, ids[1])
	rep := run(t, env, opts)
	if !rep.Has(audit.InvReadModel, "read_model_mismatch") {
		t.Fatalf("the edits were not caught: %v", rep.Violations)
	}
	want := map[string]string{"entries": ids[0], "balance_history": ids[1]}
	for _, rm := range rep.ReadModels {
		for _, d := range rm.Tables {
			key, edited := want[d.Table]
			switch {
			case edited && (!slices.Equal(d.Differ, []string{key}) || len(d.Missing)+len(d.Extra) > 0):
				t.Errorf("%s: differ %v, missing %v, extra %v; want %s differing alone", d.Table, d.Differ, d.Missing, d.Extra, key)
			case !edited && !d.OK():
				t.Errorf("%s, not edited: %s", d.Table, d.Describe(5))
			}
			delete(want, d.Table)
		}
	}
	if len(want) > 0 {
		t.Errorf("tables not compared: %v", want)
	}
}
