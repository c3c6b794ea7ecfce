package audit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// accountAt folds the first n events of an account's stream (0: all).
func accountAt(t *testing.T, env *projtest.Env, id string, n int) *domain.Account {
	t.Helper()
	evs, err := env.Store.ReadStream(context.Background(), domain.AccountStream(id), 0, eventstore.Forwards, n)
	if err != nil || len(evs) < n {
		t.Fatalf("stream of %s: %d events of %d, %v", id, len(evs), n, err)
	}
	acc := domain.NewAccount(id)
	for _, re := range evs {
		devtest.EvolveRecorded(t, acc, re)
	}
	return acc
}

// writeSnapshot replaces the account's snapshot with a at revision rev, its
// bytes passed through corrupt when set.
func writeSnapshot(t *testing.T, env *projtest.Env, a *domain.Account, rev uint64, corrupt func([]byte) []byte) {
	t.Helper()
	ctx, stream := context.Background(), domain.AccountStream(a.ID)
	b, err := domain.EncodeSnapshot(stream, a)
	if err != nil {
		t.Fatal(err)
	}
	if corrupt != nil {
		b = corrupt(b)
	}
	if _, err := env.Pool.Exec(ctx, `DELETE FROM snapshots WHERE stream = $1`, stream); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.WriteSnapshot(ctx, eventstore.Snapshot{Stream: stream, Revision: rev, Data: b}); err != nil {
		t.Fatal(err)
	}
}

// TestIncrementalAuditReadsOnlyTheSnapshotsAfterIt: an incremental audit
// does not read the checkpoint's row of an account no event after it touched
// for a snapshot the checkpoint passed (it folds the account's stream up to
// one written since, TestIncrementalAuditChecksASnapshotWrittenSinceIt); it
// checks one at the checkpoint's revision of its account at once, and one
// after it when the fold reaches it, each named when it is not the fold.
func TestIncrementalAuditReadsOnlyTheSnapshotsAfterIt(t *testing.T) {
	env, cp := spanned(t)
	from := audit.Options{From: &cp.ID}
	plain := run(t, env, from)
	if !plain.OK() || plain.Snapshots != 0 || plain.From == nil {
		t.Fatalf("without snapshots: %d checked, from %v: %v", plain.Snapshots, plain.From, plain.Violations)
	}
	// "idle": opened, a deposit and a hold, all before the checkpoint.
	at := accountAt(t, env, "idle", 0)
	passed := accountAt(t, env, "idle", int(at.Revision))
	writeSnapshot(t, env, passed, uint64(passed.Revision), nil)
	rep := run(t, env, from)
	if !rep.OK() || rep.Snapshots != 1 || rep.From.AccountsRead != plain.From.AccountsRead {
		t.Fatalf("a snapshot the checkpoint passed: %d checked, %d accounts read (%d without it): %v",
			rep.Snapshots, rep.From.AccountsRead, plain.From.AccountsRead, rep.Violations)
	}
	for _, c := range []struct {
		name    string
		a       *domain.Account
		balance int64
	}{
		{"at the checkpoint's revision", at, 0},
		{"at the checkpoint's revision, a balance it never had", at, 1000},
		{"after the checkpoint, a balance it never had", accountAt(t, env, "w-acct-2", 0), 1000},
	} {
		snap := *c.a
		snap.Balance += c.balance
		writeSnapshot(t, env, &snap, uint64(snap.Revision), nil)
		rep := run(t, env, from)
		if rep.Snapshots < 1 || rep.OK() != (c.balance == 0) || (c.balance != 0 && !snapshotMismatchOf(rep, snap.ID)) {
			t.Fatalf("a snapshot %s: %d checked, ok %v: %v", c.name, rep.Snapshots, rep.OK(), rep.Violations)
		}
		// The next case's violation must be its own, not this one's.
		writeSnapshot(t, env, c.a, uint64(c.a.Revision), nil)
	}
}

// snapshotMismatchOf reports whether rep names the snapshot of account id
// not the fold of its stream.
func snapshotMismatchOf(rep *audit.Report, id string) bool {
	for _, v := range rep.Violations {
		if v.Invariant == audit.InvSnapshot && v.Kind == "snapshot_mismatch" && v.Stream == domain.AccountStream(id) {
			return true
		}
	}
	return false
}

// TestIncrementalAuditChecksASnapshotWrittenSinceIt: a snapshot of a revision
// the checkpoint passed, written after the audit that stored the checkpoint
// began (the ledger writes them in the background, the cold load reads them),
// is checked by an incremental audit against its account's stream, though no
// event after the checkpoint touches the account; one its store says was
// taken before that audit began is trusted (TrustedFromCheckpoint), not
// counted as checked, and a full audit checks it.
func TestIncrementalAuditChecksASnapshotWrittenSinceIt(t *testing.T) {
	env, cp := spanned(t)
	ctx := context.Background()
	at := accountAt(t, env, "idle", 0)
	forged := *accountAt(t, env, "idle", int(at.Revision)) // a revision the checkpoint passed
	forged.Balance += 1000
	writeSnapshot(t, env, &forged, uint64(forged.Revision), nil)
	inc := run(t, env, audit.Options{From: &cp.ID})
	if inc.OK() || !snapshotMismatchOf(inc, "idle") || inc.Snapshots != 1 || inc.SnapsTrusted != 0 {
		t.Fatalf("a forged snapshot written since the checkpoint: ok %v, %d checked, %d trusted: %v", inc.OK(), inc.Snapshots, inc.SnapsTrusted, inc.Violations)
	}
	if _, err := env.Pool.Exec(ctx, `UPDATE snapshots SET taken = (SELECT snapshots_listed_at FROM readmodel.audit_checkpoints WHERE id = $1) - interval '1 hour'
		WHERE stream = $2`, cp.ID, domain.AccountStream("idle")); err != nil {
		t.Fatal(err)
	}
	inc = run(t, env, audit.Options{From: &cp.ID})
	if !inc.OK() || inc.Snapshots != 0 || inc.SnapsTrusted != 1 {
		t.Fatalf("a snapshot taken before the checkpoint's audit began: ok %v, %d checked, %d trusted: %v", inc.OK(), inc.Snapshots, inc.SnapsTrusted, inc.Violations)
	}
	if full := run(t, env, audit.Options{}); full.OK() || !snapshotMismatchOf(full, "idle") {
		t.Fatalf("a full audit: ok %v: %v", full.OK(), full.Violations)
	}
}

// TestIncrementalAuditChecksASnapshotWrittenDuringItsCheckpointsAudit: the
// ledger writes snapshots in the background, so one may land while the full
// audit that stores a checkpoint runs, after it listed the snapshots, which
// it then does not check: the incremental audit from its checkpoint checks
// it, though it is of a revision the checkpoint passed and no event after
// the checkpoint touches the account. The checkpoint carries the time its
// audit began listing the snapshots, no later than the snapshot's (not the
// audit's end: the audits here are shorter than snapshotTakenSlack, so
// only this comparison tells the two apart). A checkpoint without that time
// (an earlier build's, whose taken_at is its audit's end, here 10 minutes
// after the snapshot) is refused, not trusted to have checked it.
func TestIncrementalAuditChecksASnapshotWrittenDuringItsCheckpointsAudit(t *testing.T) {
	ctx := context.Background()
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 50, Seed: 23})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "idle-open", "account_id": "idle", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "idle-dep", "account_id": "idle", "amount": 500, "currency": "EUR"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "idle-hold", "account_id": "idle", "hold_id": "idle-h", "amount": 200, "currency": "EUR"})
	catchUp(t, env)
	forged := *accountAt(t, env, "idle", 2)
	forged.Balance += 1000
	data, err := domain.EncodeSnapshot(domain.AccountStream("idle"), &forged)
	if err != nil {
		t.Fatal(err)
	}
	wrote := errors.New("the fold reported no progress")
	var once sync.Once
	first := run(t, env, audit.Options{SaveCheckpoint: true, Progress: func(int64) {
		once.Do(func() {
			wrote = env.Store.WriteSnapshot(ctx, eventstore.Snapshot{Stream: domain.AccountStream("idle"), Revision: uint64(forged.Revision), Data: data})
		})
	}})
	if wrote != nil || !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the audit during which the snapshot was written: %v; ok %v, checkpoint %v: %v", wrote, first.OK(), first.Checkpoint, first.Violations)
	}
	var listed, taken time.Time
	if err := env.Pool.QueryRow(ctx, `SELECT c.snapshots_listed_at, s.taken FROM readmodel.audit_checkpoints c, snapshots s WHERE c.id = $1 AND s.stream = $2`,
		first.Checkpoint.ID, domain.AccountStream("idle")).Scan(&listed, &taken); err != nil || listed.After(taken) {
		t.Fatalf("checkpoint %d: snapshots listed at %v, after the snapshot written during its audit (%v): %v", first.Checkpoint.ID, listed, taken, err)
	}
	if inc := run(t, env, audit.Options{From: &first.Checkpoint.ID}); inc.OK() || !snapshotMismatchOf(inc, "idle") {
		t.Fatalf("the incremental audit from its checkpoint: ok %v: %v", inc.OK(), inc.Violations)
	}
	if _, err := env.Pool.Exec(ctx, `UPDATE readmodel.audit_checkpoints SET taken_at = $2::timestamptz + interval '10 minutes', snapshots_listed_at = NULL WHERE id = $1`,
		first.Checkpoint.ID, taken); err != nil {
		t.Fatal(err)
	}
	if rep, err := audit.Run(ctx, env.Store, audit.Options{From: &first.Checkpoint.ID, ReadModels: env.Pool}); err == nil || !strings.Contains(err.Error(), "full audit") {
		t.Fatalf("an incremental audit from an earlier build's checkpoint: %v, want refused; report %+v", err, rep)
	}
}
