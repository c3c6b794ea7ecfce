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
// for a snapshot the checkpoint passed (the audit that stored it checked it);
// it checks one at the checkpoint's revision of its account at once, and one
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
		t.Fatalf("a snapshot the checkpoint passed: %d listed, %d accounts read (%d without it): %v",
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
		if rep.Snapshots < 1 || rep.OK() != (c.balance == 0) || (c.balance != 0 && !rep.Has(audit.InvSnapshot, "snapshot_mismatch")) {
			t.Fatalf("a snapshot %s: %d listed, ok %v: %v", c.name, rep.Snapshots, rep.OK(), rep.Violations)
		}
	}
}
