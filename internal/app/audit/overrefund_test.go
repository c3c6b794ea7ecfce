package audit_test

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditNamesAnOverRefund: a refund appended to the store as no ledger
// decides it (devtest.AppendForgedRefund: chained, its balance and held
// stated, its key claimed, its subject written), which takes the refunds of
// deposit o-d1 (1000, refunded 600 by the ledger) to 1200, is named
// refund_exceeds_original by a full audit and by an incremental one from a
// checkpoint before it: while the fold keeps o-d1's refunded sum, and once
// it forgot it (o-d2 refunded since: the sum is read by the refunds'
// subject). A refund of a key that names no deposit or withdrawal before it
// is named refund_without_original. An exact refund in full (the forged 400)
// passes.
func TestAuditNamesAnOverRefund(t *testing.T) {
	for _, c := range []struct {
		name, kind string
		forgot     bool // o-d2 refunded after o-d1: the fold keeps o-d2 only
		original   string
		amount     int64
	}{
		{"kept", "refund_exceeds_original", false, "o-d1", 600},
		{"forgotten", "refund_exceeds_original", true, "o-d1", 600},
		{"no original", "refund_without_original", false, "o-none", 10},
		{"refunded in full", "", true, "o-d1", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, incremental := range []bool{false, true} {
				env := projtest.New(t)
				env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-open", "account_id": "o", "currency": "EUR"})
				env.MustApply(t, "deposit", map[string]any{"idempotency_key": "o-d1", "account_id": "o", "amount": 1000, "currency": "EUR"})
				env.MustApply(t, "deposit", map[string]any{"idempotency_key": "o-d2", "account_id": "o", "amount": 1000, "currency": "EUR"})
				env.MustApply(t, "refund", map[string]any{"idempotency_key": "o-f1", "original_key": "o-d1", "amount": 600})
				if c.forgot {
					env.MustApply(t, "refund", map[string]any{"idempotency_key": "o-g1", "original_key": "o-d2", "amount": 100})
				}
				rep := auditPlanted(t, env, incremental, func() {
					devtest.AppendForgedRefund(t, env.Store, "o", "o-f2", c.original, c.amount)
				})
				if c.kind == "" {
					if !rep.OK() {
						t.Fatalf("incremental %v: %v", incremental, rep.Violations)
					}
					continue
				}
				if !rep.Has(audit.InvBalance, c.kind) || rep.Checkpoint != nil {
					t.Fatalf("incremental %v: not named %s (checkpoint %v): %v", incremental, c.kind, rep.Checkpoint, rep.Violations)
				}
			}
		})
	}
}

// auditPlanted is the audit of env (one storing a checkpoint) once plant
// has written to its store: a full one, or (incremental) one from a
// checkpoint stored before the plant.
func auditPlanted(t *testing.T, env *projtest.Env, incremental bool, plant func()) *audit.Report {
	t.Helper()
	opts := audit.Options{SaveCheckpoint: true}
	if incremental {
		cp := checkpointed(t, env)
		opts.From = &cp
	}
	plant()
	catchUp(t, env)
	return run(t, env, opts)
}

// TestAuditOnKurrentDBNamesAnOverRefund: on KurrentDB, which finds no event
// by ID or subject, a forged refund of r-d1 (1000, refunded 100) of 901,
// after r-d2 was refunded (the fold keeps r-d2 only), is named
// refund_exceeds_original by a full audit and an incremental one: the
// original and its refunds read from the account's stream.
func TestAuditOnKurrentDBNamesAnOverRefund(t *testing.T) {
	st, env, cp := kurrentRefundedEnv(t)
	devtest.AppendForgedRefund(t, st, "r", "r-f3", "r-d1", 901)
	r, err := projections.NewRunner(env.Pool, st, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	for _, from := range []*int64{nil, &cp} {
		rep, err := audit.Run(context.Background(), st, audit.Options{ReadModels: env.Pool, From: from})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Has(audit.InvBalance, "refund_exceeds_original") {
			t.Fatalf("incremental %v: %v", from != nil, rep.Violations)
		}
	}
}
