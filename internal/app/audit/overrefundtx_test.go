package audit_test

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditNamesAnOverRefundOfATransaction: transaction x-t (x pays y 1000,
// one posting) refunded 600 by the ledger (slot 0); a refund appended to the
// store in slot 1 as no ledger decides it (devtest.AppendForgedTransactionRefund:
// its claim, its TransactionPosted, both legs, chained) of 600 takes its
// refunds to 1200 and is named refund_exceeds_original, by a full audit (slot
// 0 kept by the check) and by an incremental one from a checkpoint before the
// plant (the original and slot 0 read). A refund slot of a transaction never
// posted is named refund_without_original. The rest, 400, passes.
func TestAuditNamesAnOverRefundOfATransaction(t *testing.T) {
	for _, c := range []struct {
		name, kind, original string
		amount               int64
	}{
		{"over", "refund_exceeds_original", "x-t", 600},
		{"no original", "refund_without_original", "x-none", 10},
		{"refunded in full", "", "x-t", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, incremental := range []bool{false, true} {
				env := projtest.New(t)
				refundedTransaction(t, env)
				rep := auditPlanted(t, env, incremental, func() {
					devtest.AppendForgedTransactionRefund(t, env.Store, "x-f2", "x-post", c.original, 1, []domain.Posting{{From: "y", To: "x", Amount: c.amount, Currency: "EUR"}})
				})
				if c.kind == "" {
					if !rep.OK() {
						t.Fatalf("incremental %v: %v", incremental, rep.Violations)
					}
					continue
				}
				if rep.Checkpoint != nil {
					t.Fatalf("incremental %v: checkpoint %v stored", incremental, rep.Checkpoint)
				}
				onlyNamed(t, rep, c.kind, domain.RefundTransactionID(c.original, 1))
			}
		})
	}
}

// TestAuditOnKurrentDBNamesAnOverRefundOfATransaction: the same on
// KurrentDB, where the ledger posts and refunds x-t as reservation sagas: a
// forged slot 1 of 600 after the ledger's 600 is named by a full audit.
func TestAuditOnKurrentDBNamesAnOverRefundOfATransaction(t *testing.T) {
	st := devtest.KurrentDB(t)
	env := projtest.New(t)
	env.Ledger = ledger.New(st, ledger.Options{})
	refundedTransaction(t, env)
	devtest.AppendForgedTransactionRefund(t, st, "x-f2", "x-post", "x-t", 1, []domain.Posting{{From: "y", To: "x", Amount: 600, Currency: "EUR"}})
	r, err := projections.NewRunner(env.Pool, st, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	rep, err := audit.Run(context.Background(), st, audit.Options{ReadModels: env.Pool})
	if err != nil {
		t.Fatal(err)
	}
	onlyNamed(t, rep, "refund_exceeds_original", domain.RefundTransactionID("x-t", 1))
}

// onlyNamed fails t unless rep names kind of invariant 3, each of its
// violations of that kind, and no other, in transaction txID's stream.
func onlyNamed(t *testing.T, rep *audit.Report, kind, txID string) {
	t.Helper()
	for _, v := range rep.Violations {
		if v.Kind != kind || v.Stream != domain.TransactionStream(txID) {
			t.Fatalf("%s in %s: %v", v.Kind, v.Stream, rep.Violations)
		}
	}
	if !rep.Has(audit.InvBalance, kind) {
		t.Fatalf("not named %s: %v", kind, rep.Violations)
	}
}

// refundedTransaction has env's ledger open x and y, deposit 1000 to
// each (y can pay an over-refund back), post x-t (x pays y 1000) and refund
// 600 of it.
func refundedTransaction(t *testing.T, env *projtest.Env) {
	t.Helper()
	apply := func(t testing.TB, typ string, body map[string]any) { env.MustApply(t, typ, body) }
	apply(t, "open_account", map[string]any{"idempotency_key": "x-open", "account_id": "x", "currency": "EUR"})
	apply(t, "open_account", map[string]any{"idempotency_key": "y-open", "account_id": "y", "currency": "EUR"})
	apply(t, "deposit", map[string]any{"idempotency_key": "x-d1", "account_id": "x", "amount": 1000, "currency": "EUR"})
	apply(t, "deposit", map[string]any{"idempotency_key": "y-d1", "account_id": "y", "amount": 1000, "currency": "EUR"})
	apply(t, "post_transaction", map[string]any{"idempotency_key": "x-post", "transaction_id": "x-t",
		"postings": []map[string]any{{"from": "x", "to": "y", "amount": 1000, "currency": "EUR"}}})
	apply(t, "refund", map[string]any{"idempotency_key": "x-f1", "original_key": "x-post", "amount": 600})
}
