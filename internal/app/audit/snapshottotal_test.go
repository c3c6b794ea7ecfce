package audit_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// refundListForges are ways a snapshot of refundedEnv's r at revision 6
// (r-d1 refunded 100, r-d2 50; the audit's bounded fold keeps only r-d2's)
// may lie about its refunded originals while it says it forgot none: each
// lets a ledger that cold-loads it refund r-d1 beyond what is left of it.
var refundListForges = map[string]func(a *domain.Account){
	"an original omitted": func(a *domain.Account) { a.Refunded.Delete("r-d1") },
	"a sum lowered": func(a *domain.Account) {
		a.SetRefunded("r-d1", domain.RefundedSum{Amount: 10, Findable: true})
	},
	// The same total and count: r-d1's 100 listed under a deposit never refunded.
	"an original swapped": func(a *domain.Account) {
		a.Refunded.Delete("r-d1")
		a.SetRefunded("r-x0", domain.RefundedSum{Amount: 100, Findable: true})
	},
	"one original more": func(a *domain.Account) {
		a.SetRefunded("r-x0", domain.RefundedSum{Amount: 10, Findable: true})
	},
}

// writeListedSnapshot writes r's snapshot at revision 6, saying it forgot no
// refunded original, changed by forge (nil: true).
func writeListedSnapshot(t *testing.T, env *projtest.Env, forge func(a *domain.Account)) {
	t.Helper()
	a := accountAt(t, env, "r", 7)
	if a.ForgotRefunds() || a.Refunded.Of("r-d1").Amount != 100 || !a.Refunded.Of("r-d1").Findable || a.Refunded.Of("r-d2").Amount != 50 {
		t.Fatalf("r at revision %d refunded %+v, forgot %v", a.Revision, a.Refunded, a.ForgotRefunds())
	}
	if forge != nil {
		forge(a)
	}
	writeSnapshot(t, env, a, 6, nil)
	catchUp(t, env)
}

// TestAuditChecksARefundListWithoutReadingItsStream: a snapshot that says it
// forgot no refunded original, of an account whose bounded fold forgot one,
// is checked against the fold's total of the account's refunds (the
// incremental audit's carried in its checkpoint's row, migration 00026) and
// each listed sum against the store, reading none of its stream's events: a
// true one passes, each forged list is named. On ccc9ad5 each read the
// stream from its first event (7 events read of r's stream, not 0).
func TestAuditChecksARefundListWithoutReadingItsStream(t *testing.T) {
	for _, name := range append(slices.Sorted(maps.Keys(refundListForges)), "true") {
		for _, incremental := range []bool{false, true} {
			kind := map[bool]string{false: "full", true: "incremental"}[incremental]
			t.Run(name+"/"+kind, func(t *testing.T) {
				env, cp := refundedEnv(t, incremental)
				writeListedSnapshot(t, env, refundListForges[name])
				opts := audit.Options{}
				if incremental {
					opts.From = &cp
				}
				rep, read := runCountingWith(t, env, opts, "r")
				if name == "true" && (!rep.OK() || rep.Snapshots != 1 || read != 0) {
					t.Fatalf("a true list: ok %v, %d checked, %d events of r's stream read: %v", rep.OK(), rep.Snapshots, read, rep.Violations)
				}
				if name != "true" && (rep.OK() || !snapshotMismatchOf(rep, "r") || read != 0) {
					t.Fatalf("%s: ok %v, %d events of r's stream read: %v", name, rep.OK(), read, rep.Violations)
				}
			})
		}
	}
}

// TestIncrementalAuditReadsTheStreamWithoutACheckpointsTotal: a total of
// refunds edited in a checkpoint's row (to what the omitted list sums) is a
// checkpoint refused (the rows' digest); a checkpoint whose rows carry no
// total (stored before migration 00026) gives the audit none to trust, and
// the omitted original is named by reading the account's stream, as before.
func TestIncrementalAuditReadsTheStreamWithoutACheckpointsTotal(t *testing.T) {
	env, cp := refundedEnv(t, true)
	writeListedSnapshot(t, env, refundListForges["an original omitted"])
	exec(t, env, `UPDATE readmodel.audit_checkpoint_accounts SET refunds_total = 50 WHERE checkpoint_id = $1 AND account_id = 'r'`, cp)
	rep, err := audit.Run(context.Background(), env.Store, audit.Options{From: &cp, ReadModels: env.Pool})
	if err == nil || !strings.Contains(err.Error(), "edited since") {
		t.Fatalf("a checkpoint whose total of refunds was edited: %v, want refused; report %+v", err, rep)
	}
	withoutRefundsTotals(t, env, cp)
	inc, read := runCountingWith(t, env, audit.Options{From: &cp}, "r")
	if inc.OK() || !snapshotMismatchOf(inc, "r") || read != 7 {
		t.Fatalf("from a checkpoint without totals: ok %v, %d events of r's stream read (want 7): %v", inc.OK(), read, inc.Violations)
	}
}
