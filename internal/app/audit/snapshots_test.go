package audit_test

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// accountAt folds the first n events of an account's stream (0: all).
func accountAt(t testing.TB, env *projtest.Env, id string, n int) *domain.Account {
	t.Helper()
	return accountIn(t, env.Store, id, n)
}

// accountIn is accountAt of the account's stream in st.
func accountIn(t testing.TB, st eventstore.StreamReader, id string, n int) *domain.Account {
	t.Helper()
	evs, err := st.ReadStream(context.Background(), domain.AccountStream(id), 0, eventstore.Forwards, n)
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
func writeSnapshot(t testing.TB, env *projtest.Env, a *domain.Account, rev uint64, corrupt func([]byte) []byte) {
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
// reads the checkpoint's row of an account no event after it touched for a
// snapshot the checkpoint passed and does not record (it folds the account's
// stream up to it, TestIncrementalAuditChecksASnapshotWrittenSinceIt, and
// reads the account into its own checkpoint, which records it); it checks
// one at the checkpoint's revision of its account at once, and one after it
// when the fold reaches it, each named when it is not the fold.
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
	if !rep.OK() || rep.Snapshots != 1 || rep.From.AccountsRead != plain.From.AccountsRead+1 {
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
	return snapshotViolationOf(rep, "snapshot_mismatch", id)
}

// snapshotViolationOf reports whether rep names the snapshot of account id
// with a violation of kind.
func snapshotViolationOf(rep *audit.Report, kind, id string) bool {
	for _, v := range rep.Violations {
		if v.Invariant == audit.InvSnapshot && v.Kind == kind && v.Stream == domain.AccountStream(id) {
			return true
		}
	}
	return false
}

// TestIncrementalAuditChecksASnapshotWrittenSinceIt: a snapshot of a revision
// the checkpoint passed, written after the audit that stored the checkpoint
// (the ledger writes them in the background, the cold load reads them), is
// checked by an incremental audit against its account's stream, though no
// event after the checkpoint touches the account, whatever time its store
// says it was taken (here an hour before the checkpoint's audit): the
// checkpoint does not record it. A full audit names it too.
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
	if _, err := env.Pool.Exec(ctx, `UPDATE snapshots SET taken = (SELECT taken_at FROM readmodel.audit_checkpoints WHERE id = $1) - interval '1 hour'
		WHERE stream = $2`, cp.ID, domain.AccountStream("idle")); err != nil {
		t.Fatal(err)
	}
	inc = run(t, env, audit.Options{From: &cp.ID})
	if inc.OK() || !snapshotMismatchOf(inc, "idle") || inc.Snapshots != 1 || inc.SnapsTrusted != 0 {
		t.Fatalf("a forged snapshot dated before the checkpoint's audit: ok %v, %d checked, %d trusted: %v", inc.OK(), inc.Snapshots, inc.SnapsTrusted, inc.Violations)
	}
	if full := run(t, env, audit.Options{}); full.OK() || !snapshotMismatchOf(full, "idle") {
		t.Fatalf("a full audit: ok %v: %v", full.OK(), full.Violations)
	}
}
