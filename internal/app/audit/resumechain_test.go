package audit_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// chainRows reads every account of checkpoint id as the audit reads its
// trusted rows (the newest of its chain), by account.
func chainRows(t *testing.T, env *projtest.Env, id int64, ids []string) map[string]projections.AuditAccount {
	t.Helper()
	out := map[string]projections.AuditAccount{}
	if err := projections.Checkpoints.LoadAuditAccounts(context.Background(), env.Pool, id, ids, false, func(a projections.AuditAccount) error {
		out[a.AccountID] = a
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameRows fails unless two checkpoints' rows of every account agree on what
// the fold resumes from: the stream's revision, chain head and open group,
// the capture guard, the account's state and its refunds' total.
func sameRows(t *testing.T, env *projtest.Env, chained, full int64) {
	t.Helper()
	var ids []string
	rows, err := env.Pool.Query(context.Background(), `SELECT account_id FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1`, full)
	if err == nil {
		for rows.Next() {
			var id string
			if err = rows.Scan(&id); err != nil {
				break
			}
			ids = append(ids, id)
		}
		rows.Close()
	}
	if err != nil || len(ids) == 0 {
		t.Fatalf("the full audit's rows: %d (%v)", len(ids), err)
	}
	a, b := chainRows(t, env, chained, ids), chainRows(t, env, full, ids)
	for _, id := range ids {
		x, y := a[id], b[id]
		if x.Next != y.Next || x.Chain != y.Chain || x.GroupKey != y.GroupKey || x.GroupNext != y.GroupNext || x.GroupCount != y.GroupCount ||
			x.Guarded != y.Guarded || !bytes.Equal(x.Snapshot, y.Snapshot) || !reflect.DeepEqual(x.RefundsTotal, y.RefundsTotal) {
			t.Fatalf("account %s: checkpoint %d (a chain) reads %+v, %d (a full audit's) %+v", id, chained, x, full, y)
		}
	}
}

// TestIncrementalAuditsInAChainAgreeWithFullOnes (migration 00030): three
// incremental audits, each from the checkpoint the one before stored (a
// delta of it, holding the rows of the accounts it folded), each find what
// a full audit of the same ledger finds, and the chain's trusted rows are
// the full audit's, account by account; an audit from the chain's newest
// catches corruptions planted after it, in an account whose trusted row is
// the root's and in one whose row a delta holds.
func TestIncrementalAuditsInAChainAgreeWithFullOnes(t *testing.T) {
	env, cp := spanned(t)
	from := cp.ID
	for i := range 3 {
		env.Run(t, projtest.Workload{Commands: 40, Seed: uint64(30 + i), Prefix: fmt.Sprintf("c%d", i)})
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("chain-%d", i), "account_id": "w-acct-1", "amount": 5, "currency": "EUR"})
		catchUp(t, env)
		inc := run(t, env, audit.Options{From: &from, SaveCheckpoint: true})
		full := run(t, env, audit.Options{SaveCheckpoint: true})
		if !inc.OK() || !full.OK() || inc.Checkpoint == nil || full.Checkpoint == nil {
			t.Fatalf("round %d: incremental ok %v (%v), full ok %v: %v %v", i, inc.OK(), inc.Checkpoint, full.OK(), inc.Violations, full.Violations)
		}
		if inc.Events != full.Events || inc.Accounts != full.Accounts || !reflect.DeepEqual(inc.Totals, full.Totals) || inc.From.AccountsRead >= inc.From.Accounts {
			t.Fatalf("round %d: incremental %d events, %d accounts (%d of %d read), %+v; full %d, %d, %+v", i, inc.Events, inc.Accounts, inc.From.AccountsRead, inc.From.Accounts, inc.Totals, full.Events, full.Accounts, full.Totals)
		}
		var depth int
		if err := env.Pool.QueryRow(context.Background(), `SELECT depth FROM readmodel.audit_checkpoints WHERE id = $1`, inc.Checkpoint.ID).Scan(&depth); err != nil || depth != i+1 {
			t.Fatalf("round %d: the incremental audit's checkpoint at depth %d (%v), want a delta at %d", i, depth, err, i+1)
		}
		var text strings.Builder
		inc.Write(&text)
		if delta := fmt.Sprintf("a delta of checkpoint %d:", from); inc.Checkpoint.Parent != from || full.Checkpoint.Parent != 0 || !strings.Contains(text.String(), delta) {
			t.Fatalf("round %d: the checkpoints stored said parents %d and %d, want %d (a delta, %q in its report) and 0 (a root)", i, inc.Checkpoint.Parent, full.Checkpoint.Parent, from, delta)
		}
		sameRows(t, env, inc.Checkpoint.ID, full.Checkpoint.ID)
		from = inc.Checkpoint.ID
	}
	tip := run(t, env, audit.Options{From: &from})
	if !tip.OK() {
		t.Fatalf("from the chain's newest, nothing written since: %v", tip.Violations)
	}
	pos, err := eventstore.ParsePosition(tip.From.Position)
	if err != nil {
		t.Fatal(err)
	}
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "chain-after", "account_id": "idle", "amount": 5, "currency": "EUR"})
	catchUp(t, env)
	// idle's trusted row is the root's (nothing after the first checkpoint
	// touched it); w-acct-1's a delta's (every round deposits on it).
	exec(t, env, `UPDATE readmodel.balance_history SET balance = balance + 1 WHERE event_id = (SELECT event_id FROM events WHERE stream = 'account-idle' AND position > $1 ORDER BY revision DESC LIMIT 1)`, int64(pos.Prepare))
	exec(t, env, `UPDATE readmodel.accounts SET balance = balance + 1 WHERE account_id = 'w-acct-1' AND $1::bigint > 0`, int64(pos.Prepare))
	rep := run(t, env, audit.Options{From: &from, SaveCheckpoint: true})
	if rep.Checkpoint != nil || !rep.Has(audit.InvReadModel, "read_model_mismatch") || len(rep.Violations) < 2 {
		t.Fatalf("corruptions planted after the chain's newest: checkpoint %v, %v", rep.Checkpoint, rep.Violations)
	}
}
