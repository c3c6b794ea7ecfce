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

// TestAuditNamesARefundThatIsNoReversal: a forged refund slot within what is
// left of its original, but not what the ledger writes there (the original's
// postings reversed: domain.RefundReversal), is named refund_not_reversal by
// a full audit and an incremental one from a checkpoint before the plant (the
// original and the slots before read). After x-t (x pays y 1000, refunded 600
// in slot 0): slot 1 paying the rest from y to z, an account x-t never
// touched (the review's TestRev3ForgedSlotToAnotherAccountNotNamed); paying
// it the wrong way (x to y); in two postings. After m-t (z pays y 300, y pays
// x 700): slot 0 reversing only its last posting; both, the first first.
func TestAuditNamesARefundThatIsNoReversal(t *testing.T) {
	for _, c := range []struct {
		name   string
		next   func(*testing.T, *projtest.Env) (string, int)
		forged []domain.Posting
	}{
		{"to another account", nextOfXT, []domain.Posting{{From: "y", To: "z", Amount: 400, Currency: "EUR"}}},
		{"the wrong way", nextOfXT, []domain.Posting{{From: "x", To: "y", Amount: 400, Currency: "EUR"}}},
		{"in two postings", nextOfXT, []domain.Posting{{From: "y", To: "x", Amount: 200, Currency: "EUR"}, {From: "y", To: "x", Amount: 200, Currency: "EUR"}}},
		{"in part", nextOfMT, []domain.Posting{{From: "x", To: "y", Amount: 700, Currency: "EUR"}}},
		{"first first", nextOfMT, []domain.Posting{{From: "y", To: "z", Amount: 300, Currency: "EUR"}, {From: "x", To: "y", Amount: 700, Currency: "EUR"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, incremental := range []bool{false, true} {
				env := projtest.New(t)
				tx, slot := c.next(t, env)
				rep := auditPlanted(t, env, incremental, func() {
					devtest.AppendForgedTransactionRefund(t, env.Store, "x-g", "x-post", tx, slot, c.forged)
				})
				if rep.Checkpoint != nil {
					t.Fatalf("incremental %v: checkpoint %v stored", incremental, rep.Checkpoint)
				}
				onlyNamed(t, rep, "refund_not_reversal", domain.RefundTransactionID(tx, slot))
			}
		})
	}
}

// nextOfXT has env's ledger post x-t (x pays y 1000) and refund 600 of it
// (refundedTransaction), and open z: x-t's next refund slot is 1.
func nextOfXT(t *testing.T, env *projtest.Env) (string, int) {
	t.Helper()
	refundedTransaction(t, env)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "z-open", "account_id": "z", "currency": "EUR"})
	return "x-t", 1
}

// nextOfMT has env's ledger open x, y and z with 1000 each and post m-t (z
// pays y 300, y pays x 700) under the key x-post: its next refund slot is 0.
func nextOfMT(t *testing.T, env *projtest.Env) (string, int) {
	t.Helper()
	for _, a := range []string{"x", "y", "z"} {
		env.MustApply(t, "open_account", map[string]any{"idempotency_key": a + "-open", "account_id": a, "currency": "EUR"})
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": a + "-d1", "account_id": a, "amount": 1000, "currency": "EUR"})
	}
	env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": "x-post", "transaction_id": "m-t", "postings": []map[string]any{
		{"from": "z", "to": "y", "amount": 300, "currency": "EUR"}, {"from": "y", "to": "x", "amount": 700, "currency": "EUR"}}})
	return "m-t", 0
}

// TestAuditOnKurrentDBNamesAnOverRefundOfATransaction: the same on
// KurrentDB, where the ledger posts and refunds x-t as reservation sagas: a
// forged slot 1 of 600 after the ledger's 600 is named refund_exceeds_original,
// one paying the 400 left to z (no reversal) refund_not_reversal, by a full
// audit.
func TestAuditOnKurrentDBNamesAnOverRefundOfATransaction(t *testing.T) {
	for _, c := range []struct {
		kind   string
		forged domain.Posting
	}{
		{"refund_exceeds_original", domain.Posting{From: "y", To: "x", Amount: 600, Currency: "EUR"}},
		{"refund_not_reversal", domain.Posting{From: "y", To: "z", Amount: 400, Currency: "EUR"}},
	} {
		t.Run(c.kind, func(t *testing.T) {
			st := devtest.KurrentDB(t)
			env := projtest.New(t)
			env.Ledger = ledger.New(st, ledger.Options{})
			nextOfXT(t, env)
			devtest.AppendForgedTransactionRefund(t, st, "x-f2", "x-post", "x-t", 1, []domain.Posting{c.forged})
			r, err := projections.NewRunner(env.Pool, st, projections.Options{})
			if err != nil {
				t.Fatal(err)
			}
			devtest.CatchUp(t, r)
			rep, err := audit.Run(context.Background(), st, audit.Options{ReadModels: env.Pool})
			if err != nil {
				t.Fatal(err)
			}
			onlyNamed(t, rep, c.kind, domain.RefundTransactionID("x-t", 1))
		})
	}
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
