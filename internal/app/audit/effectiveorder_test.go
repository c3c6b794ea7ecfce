package audit_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestEffectiveMismatchesAreListedInAccountOrder: the balance-history rows
// of twelve accounts deleted, invariant 9 names each account's
// effective_balance_mismatch (found missing from the read model, the fold's
// accounts kept in a map) in account order, as the rest of the report lists
// accounts, in every run: before, in the map's order, which changes from run
// to run.
func TestEffectiveMismatchesAreListedInAccountOrder(t *testing.T) {
	env := projtest.New(t)
	var want []string
	for i := range 12 {
		id := fmt.Sprintf("ord-%02d", i)
		env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-" + id, "account_id": id, "currency": "EUR"})
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-" + id, "account_id": id, "amount": 10 + i, "currency": "EUR"})
		want = append(want, "account-"+id)
	}
	catchUp(t, env)
	if _, err := env.Pool.Exec(context.Background(), `DELETE FROM readmodel.balance_history WHERE account_id LIKE 'ord-%'`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		var got []string
		for _, v := range run(t, env, audit.Options{}).Violations {
			if v.Invariant == audit.InvEffective && v.Kind == "effective_balance_mismatch" {
				got = append(got, v.Stream)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("effective_balance_mismatch listed for %v, want %v", got, want)
		}
	}
}

// TestUntouchedEffectiveMismatchesPastTheLimitAreTheFirst: the last
// balance-history rows of twelve accounts an incremental audit does not
// touch edited after its checkpoint, the audit, listing three violations
// (--max-violations), lists the first three accounts in account order, in
// every run: before, the statement that finds them (untouchedMismatches)
// kept three in whatever order its plan gave (ord-00, -02 and -03 on the
// build before), the accounts' rows written in no order.
func TestUntouchedEffectiveMismatchesPastTheLimitAreTheFirst(t *testing.T) {
	env := projtest.New(t)
	var want []string
	for i := range 12 {
		want = append(want, fmt.Sprintf("account-ord-%02d", i))
	}
	for _, i := range []int{7, 11, 2, 9, 0, 5, 10, 3, 8, 1, 6, 4} { // the rows written in no order
		id := fmt.Sprintf("ord-%02d", i)
		env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-" + id, "account_id": id, "currency": "EUR"})
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-" + id, "account_id": id, "amount": 10 + i, "currency": "EUR"})
	}
	catchUp(t, env)
	cp := run(t, env, audit.Options{SaveCheckpoint: true})
	if !cp.OK() || cp.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", cp.OK(), cp.Checkpoint, cp.Violations)
	}
	if _, err := env.Pool.Exec(context.Background(), `UPDATE readmodel.balance_history SET balance = balance + 1 WHERE account_id LIKE 'ord-%'`); err != nil {
		t.Fatal(err)
	}
	all := run(t, env, audit.Options{From: &cp.Checkpoint.ID})
	if n := countKind(all.Violations, "effective_balance_mismatch"); n != len(want) || all.ViolationCount != len(all.Violations) {
		t.Fatalf("with no limit reached: %d effective_balance_mismatch listed, want %d; %d counted, %d listed", n, len(want), all.ViolationCount, len(all.Violations))
	}
	for range 3 {
		var got []string
		rep := run(t, env, audit.Options{From: &cp.Checkpoint.ID, MaxViolations: 3})
		for _, v := range rep.Violations {
			if v.Invariant == audit.InvEffective && v.Kind == "effective_balance_mismatch" {
				got = append(got, v.Stream)
			}
		}
		if !slices.Equal(got, want[:3]) {
			t.Fatalf("effective_balance_mismatch listed for %v, want %v", got, want[:3])
		}
		if rep.ViolationCount != all.ViolationCount { // every one counted, listed or not (Options.MaxViolations)
			t.Fatalf("%d violations counted with --max-violations 3, %d with no limit reached", rep.ViolationCount, all.ViolationCount)
		}
	}
}

// countKind is the number of violations of kind in vs.
func countKind(vs []audit.Violation, kind string) int {
	n := 0
	for _, v := range vs {
		if v.Kind == kind {
			n++
		}
	}
	return n
}
