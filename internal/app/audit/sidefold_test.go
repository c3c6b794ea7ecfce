package audit_test

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// The snapshot of an account at the revision R that closes a hold holds
// that hold and the one closed before it (H1) whole. The main fold compares
// it at R before forgetting the hold closed at R, so H1 is compared by the
// digest its stream state keeps (findability included). These tests forge
// H1's findability in such a snapshot and have each way an audit compares
// one name it: a hold flagged findable that is not is forgotten by a ledger
// that cold-loads the snapshot and cannot be found again.

// sideFoldEnv is closedHoldsEnv with two more holds of sh placed and
// released after its checkpoint and a deposit after them, no snapshot of
// sh, and sh's revision that released the last hold (sh-5).
func sideFoldEnv(t *testing.T) (*projtest.Env, int64, uint64) {
	t.Helper()
	env, cp := closedHoldsEnv(t)
	for _, h := range []string{"sh-4", "sh-5"} {
		env.MustApply(t, "place_hold", map[string]any{"idempotency_key": h + "-hold", "account_id": "sh", "hold_id": h, "amount": 10, "currency": "EUR"})
		env.MustApply(t, "release_hold", map[string]any{"idempotency_key": h + "-release", "account_id": "sh", "hold_id": h})
	}
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "sh-dep-after", "account_id": "sh", "amount": 5, "currency": "EUR"})
	catchUp(t, env)
	return env, cp, lastButOne(t, env, "sh")
}

// lastButOne deletes any snapshot of account id and returns the revision
// of the event before its stream's last.
func lastButOne(t *testing.T, env *projtest.Env, id string) uint64 {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Pool.Exec(ctx, `DELETE FROM snapshots WHERE stream = $1`, domain.AccountStream(id)); err != nil {
		t.Fatal(err)
	}
	evs, err := env.Store.ReadStream(ctx, domain.AccountStream(id), 0, eventstore.Forwards, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(len(evs) - 2)
}

// writeUnfindable writes the snapshot of sh at rev, every hold kept, with
// hold h (closed before the one closed at rev, so kept beside it) flagged
// not findable.
func writeUnfindable(t *testing.T, env *projtest.Env, rev uint64, h, closedAtRev string) {
	t.Helper()
	a := accountAt(t, env, "sh", int(rev)+1)
	forged := a.Holds[h]
	if forged == nil || !forged.Findable || forged.Status == domain.HoldStatusActive || a.Holds[closedAtRev] == nil {
		t.Fatalf("premise: hold %s %+v, %s %+v", h, forged, closedAtRev, a.Holds[closedAtRev])
	}
	forged.Findable = false
	writeSnapshot(t, env, a, rev, nil)
}

// TestMainFoldNamesAClosedHoldsFindability: listed before the audit, the
// forged snapshot is compared by the main fold, which names it.
func TestMainFoldNamesAClosedHoldsFindability(t *testing.T) {
	env, cp, rev := sideFoldEnv(t)
	writeUnfindable(t, env, rev, "sh-4", "sh-5")
	rep := run(t, env, audit.Options{From: &cp, SaveCheckpoint: true})
	if rep.OK() || !snapshotMismatchOf(rep, "sh") {
		t.Fatalf("the main fold passed the snapshot: %v", rep.Violations)
	}
}

// TestSideFoldNamesAClosedHoldsFindability: written while a checkpointing
// incremental audit runs (at its first progress report), the forged
// snapshot is compared by the side fold from the checkpoint's row
// (snapshotswritten.go), which must name it as the main fold does, not
// record it as checked for the next incremental audit to trust.
func TestSideFoldNamesAClosedHoldsFindability(t *testing.T) {
	env, cp, rev := sideFoldEnv(t)
	written := false
	rep := run(t, env, audit.Options{From: &cp, SaveCheckpoint: true, Progress: func(int64, int64) {
		if !written {
			written = true
			writeUnfindable(t, env, rev, "sh-4", "sh-5")
		}
	}})
	if !written {
		t.Fatal("the audit reported no progress")
	}
	if rep.OK() || !snapshotMismatchOf(rep, "sh") {
		t.Fatalf("the side fold passed the snapshot (checked %d): %v", rep.Snapshots, rep.Violations)
	}
}

// TestIncrementalAuditNamesAClosedHoldsFindabilityAtItsCheckpoint: a
// snapshot at exactly the checkpoint's revision of its account, not
// recorded by it, holds a hold (sh-2) the checkpoint's row no longer keeps
// (it keeps the last closed one, sh-3): it must be compared with the
// stream's fold, not the row, and named.
func TestIncrementalAuditNamesAClosedHoldsFindabilityAtItsCheckpoint(t *testing.T) {
	env, cp := closedHoldsEnv(t)
	rev := lastButOne(t, env, "sh") // the checkpoint's revision of sh: the deposit after it is its last
	writeUnfindable(t, env, rev, "sh-2", "sh-3")
	rep := run(t, env, audit.Options{From: &cp, SaveCheckpoint: true})
	if rep.OK() || !snapshotMismatchOf(rep, "sh") {
		t.Fatalf("the audit passed the snapshot at its checkpoint (checked %d, trusted %d): %v", rep.Snapshots, rep.SnapsTrusted, rep.Violations)
	}
}

// TestIncrementalAuditTrustsNoRecordOfABuildThatComparedAfterTheForgets: a
// checkpoint stored by a build whose side fold or check at the checkpoint's
// revision compared a snapshot after the forgets of its event (its state
// says snapshot_refunds_listed) may record a snapshot with a closed hold's
// findability forged, as the tests above show: an incremental audit from it
// trusts none of its records and checks each snapshot from its stream's
// first event.
func TestIncrementalAuditTrustsNoRecordOfABuildThatComparedAfterTheForgets(t *testing.T) {
	env, id := recordedTrueSnapshot(t)
	ctx := context.Background()
	var state []byte
	if err := env.Pool.QueryRow(ctx, `SELECT state FROM readmodel.audit_checkpoints WHERE id = $1`, id).Scan(&state); err != nil {
		t.Fatal(err)
	}
	exec(t, env, `UPDATE readmodel.audit_checkpoints SET state = $2::bytea, state_digest = md5($2::bytea) WHERE id = $1`, id, withFlagOf(t, state, "snapshot_refunds_listed"))
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "r-after", "account_id": "r", "amount": 5, "currency": "EUR"})
	catchUp(t, env)
	inc := run(t, env, audit.Options{From: &id})
	if !inc.OK() || inc.SnapsTrusted != 0 || inc.SnapsFromStart != 1 {
		t.Fatalf("from a checkpoint of a build that compared after the forgets: ok %v, %d trusted, %d from the first event: %v", inc.OK(), inc.SnapsTrusted, inc.SnapsFromStart, inc.Violations)
	}
}
