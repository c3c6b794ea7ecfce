package audit_test

import (
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// heldEnv opens account ca with 1000, places hold c1 of 100 and captures it,
// places hold c2 of 100 (revisions 0 to 4), runs a checkpointing audit when
// checkpoint is set (its ID, else 0), then makes 5 deposits of 10
// (revisions 5 to 9). At every revision from 4, held is 100: c2's.
func heldEnv(t *testing.T, checkpoint bool) (*projtest.Env, int64) {
	t.Helper()
	env := projtest.New(t)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "ca-open", "account_id": "ca", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "ca-d", "account_id": "ca", "amount": 1000, "currency": "EUR"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "ca-p1", "account_id": "ca", "hold_id": "c1", "amount": 100, "currency": "EUR"})
	env.MustApply(t, "capture_hold", map[string]any{"idempotency_key": "ca-c1", "account_id": "ca", "hold_id": "c1"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "ca-p2", "account_id": "ca", "hold_id": "c2", "amount": 100, "currency": "EUR"})
	var cp int64
	if checkpoint {
		cp = checkpointed(t, env)
	}
	for i := range 5 {
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("ca-x%d", i), "account_id": "ca", "amount": 10, "currency": "EUR"})
	}
	return env, cp
}

// holdIn is the hold id of a snapshot's state, as a forgery edits it.
func holdIn(t *testing.T, state map[string]any, id string) map[string]any {
	for _, h := range state["holds"].([]any) {
		if h := h.(map[string]any); h["id"] == id {
			return h
		}
	}
	t.Fatalf("no hold %s in %v", id, state["holds"])
	return nil
}

// TestAuditNamesAForgedHeldOrAClosedHoldShownActive: a snapshot of ca, its
// hash taken again, whose held is not its active holds' sum (which its
// decoder refuses: snapshot_unreadable), or which shows the captured c1
// active, with held raised to match or with c2 shown released to keep held
// (which the decoder, and with the second a cold load, cannot see: the
// ledger would capture c1 again), is named by a full audit and by
// incremental ones reaching it after their checkpoint and at its revision,
// and none stores a checkpoint. The held forgery was named
// snapshot_mismatch before the decoder refused it.
func TestAuditNamesAForgedHeldOrAClosedHoldShownActive(t *testing.T) {
	for name, c := range map[string]struct {
		kind string
		edit func(t *testing.T, st map[string]any)
	}{
		"held 0": {"snapshot_unreadable", func(t *testing.T, st map[string]any) { st["held"] = 0 }},
		"c1 active, held too": {"snapshot_mismatch", func(t *testing.T, st map[string]any) {
			holdIn(t, st, "c1")["status"], st["held"] = "active", 200
		}},
		"c1 active, c2 released": {"snapshot_mismatch", func(t *testing.T, st map[string]any) {
			holdIn(t, st, "c1")["status"], holdIn(t, st, "c2")["status"] = "active", "released"
		}},
	} {
		t.Run(name, func(t *testing.T) {
			forge := func(t *testing.T, env *projtest.Env, n int) {
				a := accountAt(t, env, "ca", n)
				writeSnapshot(t, env, a, uint64(a.Revision), func(b []byte) []byte {
					return devtest.ForgeSnapshotState(t, b, func(st map[string]any) { c.edit(t, st) })
				})
				catchUp(t, env)
			}
			t.Run("full", func(t *testing.T) {
				env, _ := heldEnv(t, false)
				forge(t, env, 7)
				rep := run(t, env, audit.Options{SaveCheckpoint: true})
				if rep.OK() || !snapshotViolationOf(rep, c.kind, "ca") || rep.Checkpoint != nil {
					t.Fatalf("ok %v, checkpoint %v: %v", rep.OK(), rep.Checkpoint, rep.Violations)
				}
			})
			for _, n := range []int{7, 5} { // at revision 6, after the checkpoint; at 4, the checkpoint's
				t.Run(fmt.Sprintf("incremental-at-%d", n-1), func(t *testing.T) {
					env, cp := heldEnv(t, true)
					forge(t, env, n)
					rep := run(t, env, audit.Options{From: &cp, SaveCheckpoint: true})
					if rep.OK() || !snapshotViolationOf(rep, c.kind, "ca") || rep.Checkpoint != nil {
						t.Fatalf("ok %v, checkpoint %v: %v", rep.OK(), rep.Checkpoint, rep.Violations)
					}
				})
			}
		})
	}
}
