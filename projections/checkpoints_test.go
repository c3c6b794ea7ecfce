package projections_test

import (
	"context"
	"errors"
	"maps"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditCheckpointsKept: the audit checkpoints stored are bounded; the
// oldest beyond AuditCheckpointsKept are dropped as a new one is saved, and
// asking for a dropped one is ErrNoAuditCheckpoint.
func TestAuditCheckpointsKept(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	var ids []int64
	for i := range projections.AuditCheckpointsKept + 2 {
		id, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{
			Checkpoint: projections.AuditCheckpoint{Position: eventstore.Position{Commit: uint64(i), Prepare: uint64(i)}, Events: int64(i), State: []byte{byte(i)}, AccountsTable: "0"},
			Next:       accountsOf("a", "b"), Rows: 2})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var n, rows int
	if err := env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM readmodel.audit_checkpoints), (SELECT count(*) FROM readmodel.audit_checkpoint_accounts)`).Scan(&n, &rows); err != nil ||
		n != projections.AuditCheckpointsKept || rows != 2*n {
		t.Fatalf("%d checkpoints kept with %d account rows (%v), want %d with two each", n, rows, err, projections.AuditCheckpointsKept)
	}
	for _, id := range ids[:2] {
		if _, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, id); !errors.Is(err, projections.ErrNoAuditCheckpoint) {
			t.Fatalf("checkpoint %d, dropped: %v", id, err)
		}
	}
	kept, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, ids[2])
	if err != nil || kept.Events != 2 || kept.State[0] != 2 || kept.Accounts != 2 {
		t.Fatalf("checkpoint %d: %+v, %v", ids[2], kept, err)
	}
	last, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, 0)
	if want := int64(len(ids) - 1); err != nil || last.ID != ids[len(ids)-1] || last.Events != want || last.Position.Prepare != uint64(want) {
		t.Fatalf("the last checkpoint: %+v, %v", last, err)
	}
}

// accountsOf hands an account row of each ID, as SaveAudit's source.
func accountsOf(ids ...string) func() (projections.AuditAccount, bool, error) {
	return func() (projections.AuditAccount, bool, error) {
		if len(ids) == 0 {
			return projections.AuditAccount{}, false, nil
		}
		a := projections.AuditAccount{AccountID: ids[0], Next: 3, Chain: "c-" + ids[0], Snapshot: []byte(ids[0])}
		ids = ids[1:]
		return a, true, nil
	}
}

var emptyState = projections.AuditCheckpoint{State: []byte{}, AccountsTable: "0"}

// TestAuditCheckpointAccounts: a checkpoint saved from an earlier one keeps
// that one's rows of the accounts it does not write itself and its own of
// those it does; the rows are read by account (and the guarded ones whatever
// is asked); a save whose rows do not add up to what it expects stores
// nothing.
func TestAuditCheckpointAccounts(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	first, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{Checkpoint: emptyState, Next: accountsOf("a", "b", "c"), Rows: 3})
	if err != nil {
		t.Fatal(err)
	}
	guarded := func() func() (projections.AuditAccount, bool, error) {
		next := accountsOf("b", "d")
		return func() (projections.AuditAccount, bool, error) {
			a, ok, err := next()
			a.Next, a.Guarded = 7, a.AccountID == "d"
			return a, ok, err
		}
	}
	second, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{Checkpoint: emptyState, Next: guarded(), CarryFrom: first, Rows: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	err = projections.Checkpoints.LoadAuditAccounts(ctx, env.Pool, second, []string{"a", "b", "x"}, true, func(a projections.AuditAccount) error {
		got[a.AccountID] = a.Next
		return nil
	})
	if want := map[string]uint64{"a": 3, "b": 7, "d": 7}; err != nil || !maps.Equal(got, want) {
		t.Fatalf("rows read %v (%v), want %v", got, err, want)
	}
	if _, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{Checkpoint: emptyState, Next: accountsOf("e"), CarryFrom: first, Rows: 5}); err == nil {
		t.Fatal("a save of 4 rows expecting 5 was stored")
	}
	last, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, 0)
	if err != nil || last.ID != second || last.Accounts != 4 {
		t.Fatalf("the last checkpoint: %+v, %v", last, err)
	}
	for _, edit := range []string{
		`UPDATE readmodel.audit_checkpoint_accounts SET next = next + 1 WHERE checkpoint_id = $1 AND account_id = 'a'`,
		`UPDATE readmodel.audit_checkpoint_accounts SET snapshot = snapshot || '\x00' WHERE checkpoint_id = $1 AND account_id = 'b'`,
		`DELETE FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1 AND account_id = 'c'`,
	} {
		tx, err := env.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, edit, second); err != nil {
			t.Fatal(err)
		}
		_, err = projections.Checkpoints.LoadAudit(ctx, tx, second)
		_ = tx.Rollback(ctx)
		if err == nil {
			t.Fatalf("a checkpoint whose rows were edited (%s) was loaded", edit)
		}
	}
}

// TestAuditSaveRechecksWhatItCarries: a save that carries an earlier
// checkpoint's rows refuses them when they or its state no longer match the
// digests stored with them (its own digest would be computed over the edited
// rows and bless them), and stores nothing; a checkpoint without its digests
// (an earlier build's) is refused by LoadAudit.
func TestAuditSaveRechecksWhatItCarries(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	for _, edit := range []string{
		`UPDATE readmodel.audit_checkpoint_accounts SET next = next + 1 WHERE checkpoint_id = $1 AND account_id = 'a'`,
		`UPDATE readmodel.audit_checkpoints SET state = '\x01' WHERE id = $1`,
	} {
		first, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{Checkpoint: emptyState, Next: accountsOf("a", "b"), Rows: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.Pool.Exec(ctx, edit, first); err != nil {
			t.Fatal(err)
		}
		if _, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, first); err == nil {
			t.Fatalf("a checkpoint edited (%s) was loaded", edit)
		}
		if id, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditSave{Checkpoint: emptyState, Next: accountsOf("b"), CarryFrom: first, Rows: 2}); err == nil {
			t.Fatalf("checkpoint %d carried the rows of checkpoint %d, edited (%s)", id, first, edit)
		}
	}
	var earlier int64
	if err := env.Pool.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, accounts_digest)
		VALUES (0, 0, 0, '', 0) RETURNING id`).Scan(&earlier); err != nil {
		t.Fatal(err)
	}
	if _, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, earlier); err == nil {
		t.Fatal("a checkpoint without its state's and accounts table's digests was loaded")
	}
}
