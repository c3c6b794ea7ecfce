package audit_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditNamesAClosedHoldPlacedAgain: a hold closed before the checkpoint
// (the account's last closed, kept in its checkpoint row) placed again by an
// event after it is named by the incremental audit, as by the full one,
// rather than its row trusted as the checkpoint's digest had it.
func TestAuditNamesAClosedHoldPlacedAgain(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 31})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "again-open", "account_id": "again", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "again-dep", "account_id": "again", "amount": 500, "currency": "EUR"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "again-hold", "account_id": "again", "hold_id": "again-h", "amount": 200, "currency": "EUR"})
	env.MustApply(t, "release_hold", map[string]any{"idempotency_key": "again-release", "account_id": "again", "hold_id": "again-h"})
	catchUp(t, env)
	first := run(t, env, audit.Options{SaveCheckpoint: true})
	if !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
	}
	exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT stream, (SELECT max(revision) + 1 FROM events WHERE stream = 'account-again'), gen_random_uuid(), type, data, metadata
		FROM events WHERE stream = 'account-again' AND type = 'HoldPlaced' AND convert_from(data, 'UTF8')::jsonb->>'hold_id' = 'again-h'`)
	for name, opts := range map[string]audit.Options{"incremental": {From: &first.Checkpoint.ID}, "full": {}} {
		if rep := run(t, env, opts); !rep.Has(audit.InvBalance, "hold_placed_again") {
			t.Errorf("the %s audit did not name the closed hold placed again: %v", name, rep.Violations)
		}
	}
}

// TestIncrementalAuditAgreesAcrossHoldsClosedAfterIt: holds placed before
// the checkpoint and expired, captured or released after it: the audit from
// the checkpoint gives the full audit's verdict, clean, and with the holds
// table's row of each of them edited (the expired one made active again, the
// captured one's capture changed, the released one's key changed).
func TestIncrementalAuditAgreesAcrossHoldsClosedAfterIt(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 32})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "x-open", "account_id": "x", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "x-dep", "account_id": "x", "amount": 1000, "currency": "EUR"})
	expires := devtest.Epoch.Add(time.Hour)
	for _, h := range []map[string]any{
		{"idempotency_key": "x-exp", "hold_id": "x-exp", "amount": 100, "expires_at": expires.Format(time.RFC3339)},
		{"idempotency_key": "x-cap", "hold_id": "x-cap", "amount": 200},
		{"idempotency_key": "x-rel", "hold_id": "x-rel", "amount": 300},
		{"idempotency_key": "x-old", "hold_id": "x-old", "amount": 400},
	} {
		h["account_id"], h["currency"] = "x", "EUR"
		env.MustApply(t, "place_hold", h)
	}
	env.MustApply(t, "release_hold", map[string]any{"idempotency_key": "x-old-release", "account_id": "x", "hold_id": "x-old"})
	catchUp(t, env)
	first := run(t, env, audit.Options{SaveCheckpoint: true})
	if !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
	}
	if done, err := env.Ledger.ExpireHold(context.Background(), "x", "x-exp", "x-exp", expires.Add(time.Minute)); !done || err != nil {
		t.Fatalf("expiring x-exp: done %v, %v", done, err)
	}
	env.MustApply(t, "capture_hold", map[string]any{"idempotency_key": "x-capture", "account_id": "x", "hold_id": "x-cap", "amount": 150})
	env.MustApply(t, "release_hold", map[string]any{"idempotency_key": "x-release", "account_id": "x", "hold_id": "x-rel"})
	catchUp(t, env)
	verdicts := func(want bool) {
		t.Helper()
		inc, full := run(t, env, audit.Options{From: &first.Checkpoint.ID}), run(t, env, audit.Options{})
		if inc.OK() != want || full.OK() != want || inc.Has(audit.InvReadModel, "read_model_mismatch") != full.Has(audit.InvReadModel, "read_model_mismatch") {
			t.Fatalf("incremental ok %v, full ok %v, want %v: %v; %v", inc.OK(), full.OK(), want, inc.Violations, full.Violations)
		}
	}
	verdicts(true)
	for _, c := range []struct{ plant, undo string }{
		{`UPDATE readmodel.holds SET status = 'active' WHERE account_id = 'x' AND hold_id = 'x-exp' AND status = 'expired'`,
			`UPDATE readmodel.holds SET status = 'expired' WHERE account_id = 'x' AND hold_id = 'x-exp'`},
		{`UPDATE readmodel.holds SET captured = captured + 1 WHERE account_id = 'x' AND hold_id = 'x-cap' AND captured = 150`,
			`UPDATE readmodel.holds SET captured = captured - 1 WHERE account_id = 'x' AND hold_id = 'x-cap'`},
		{`UPDATE readmodel.holds SET hold_id = 'x-gone' WHERE account_id = 'x' AND hold_id = 'x-rel' AND status = 'released'`,
			`UPDATE readmodel.holds SET hold_id = 'x-rel' WHERE account_id = 'x' AND hold_id = 'x-gone'`},
	} {
		exec(t, env, c.plant)
		verdicts(false)
		exec(t, env, c.undo)
	}
	verdicts(true)
	// A hold closed before the checkpoint is trusted by the incremental
	// audit, as the history rows before it are (migration 00018): its row
	// edited is caught by the full audit only, and the report says so.
	exec(t, env, `UPDATE readmodel.holds SET amount = amount + 1 WHERE account_id = 'x' AND hold_id = 'x-old' AND status = 'released'`)
	inc, full := run(t, env, audit.Options{From: &first.Checkpoint.ID}), run(t, env, audit.Options{})
	if !inc.OK() || !slices.Contains(inc.From.Trusted, "the holds closed before the checkpoint: their rows in the holds table") || !full.Has(audit.InvReadModel, "read_model_mismatch") {
		t.Fatalf("a hold closed before the checkpoint edited: incremental ok %v, trusting %q; full: %v", inc.OK(), inc.From.Trusted, full.Violations)
	}
}
