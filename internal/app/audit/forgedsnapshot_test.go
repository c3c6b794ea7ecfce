package audit_test

import (
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// forgedSums edit the state of refundedEnv's r (r-d1 refunded 100, r-d2 50;
// the audit's bounded fold keeps r-d2 only) as no ledger writes it, the hash
// taken again: a refunded sum of 0 or less reads, to a ledger's cold load, as
// an original refunded nothing, refunded again in full.
var forgedSums = map[string]func(st map[string]any){
	"zero-kept": func(st map[string]any) {
		st["refunded"].(map[string]any)["r-d2"] = 0
		st["forgot_refunds"] = true
	},
	"zero-kept-unfindable": func(st map[string]any) {
		st["refunded"].(map[string]any)["r-d2"] = 0
		st["findable_refunds"] = []string{"r-d1"}
		st["forgot_refunds"] = true
	},
	"zero-forgotten": func(st map[string]any) {
		st["refunded"].(map[string]any)["r-d1"] = 0
		st["forgot_refunds"] = true
	},
	"negative": func(st map[string]any) {
		st["refunded"].(map[string]any)["r-d1"] = -100
	},
}

// writeForgedState writes r's snapshot of its first n events with its state
// edited by edit.
func writeForgedState(t *testing.T, env *projtest.Env, n int, edit func(st map[string]any)) {
	t.Helper()
	a := accountAt(t, env, "r", n)
	writeSnapshot(t, env, a, uint64(a.Revision), func(b []byte) []byte { return devtest.ForgeSnapshotState(t, b, edit) })
	catchUp(t, env)
}

// TestAuditNamesAForgedRefundedSumOfZero: each forged refunded sum is named
// snapshot_unreadable by a full audit, an incremental one that reaches it
// after its checkpoint, and one that checks it at a revision its checkpoint
// passed, and none stores a checkpoint. Shown failing on bde2e73: every
// "zero-kept" and "zero-kept-unfindable" audit passed (the comparison drops
// sums of 0), the others were named snapshot_mismatch.
func TestAuditNamesAForgedRefundedSumOfZero(t *testing.T) {
	for name, edit := range forgedSums {
		t.Run(name, func(t *testing.T) {
			t.Run("full", func(t *testing.T) {
				env, _ := refundedEnv(t, false)
				writeForgedState(t, env, 7, edit)
				rep := run(t, env, audit.Options{SaveCheckpoint: true})
				if rep.OK() || !snapshotViolationOf(rep, "snapshot_unreadable", "r") || rep.Checkpoint != nil {
					t.Fatalf("ok %v, checkpoint %v: %v", rep.OK(), rep.Checkpoint, rep.Violations)
				}
			})
			for _, n := range []int{7, 5} { // at revision 6, after the checkpoint; at 4, the checkpoint's
				t.Run(fmt.Sprintf("incremental-at-%d", n-1), func(t *testing.T) {
					env, cp := refundedEnv(t, true)
					writeForgedState(t, env, n, edit)
					rep := run(t, env, audit.Options{From: &cp, SaveCheckpoint: true})
					if rep.OK() || !snapshotViolationOf(rep, "snapshot_unreadable", "r") || rep.Checkpoint != nil {
						t.Fatalf("ok %v, checkpoint %v: %v", rep.OK(), rep.Checkpoint, rep.Violations)
					}
				})
			}
		})
	}
}
