package audit_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditNamesAClosedHoldPlacedAgain: a hold closed before the checkpoint
// placed again by a copy of its HoldPlaced after it (same key, an event ID of
// its own) is named by the incremental audit, as by the full one, rather than
// its row trusted as the checkpoint's digest had it: hold_placed_again for the
// account's last closed hold (kept in its checkpoint row), key_decided_twice
// for an older one the account no longer keeps (boundAccount, HoldLimit 1),
// found through its claim's revision (claimBefore).
func TestAuditNamesAClosedHoldPlacedAgain(t *testing.T) {
	for _, c := range []struct {
		name, kind string
		invariant  int
		later      bool // a second hold placed and released after again-h
	}{
		{"the last closed hold", "hold_placed_again", audit.InvBalance, false},
		{"an older closed hold", "key_decided_twice", audit.InvKeyOnce, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := placedAgain(t, c.later)
			for name, opts := range map[string]*audit.Options{"incremental": {From: &env.checkpoint}, "full": {}} {
				if rep := run(t, env.Env, *opts); rep.OK() || !rep.Has(c.invariant, c.kind) {
					t.Errorf("the %s audit did not name the closed hold placed again %s (ok %v): %v", name, c.kind, rep.OK(), rep.Violations)
				}
			}
		})
	}
}

type placedAgainEnv struct {
	*projtest.Env
	checkpoint int64
}

// placedAgain is a ledger audited clean with a checkpoint after account
// "again" placed and released hold again-h (and again-h2 after it, when
// later), then the HoldPlaced of again-h copied after the checkpoint under an
// event ID of its own, and projected.
func placedAgain(t *testing.T, later bool) placedAgainEnv {
	t.Helper()
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 31})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "again-open", "account_id": "again", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "again-dep", "account_id": "again", "amount": 500, "currency": "EUR"})
	holds := []string{"again-h"}
	if later {
		holds = append(holds, "again-h2")
	}
	for _, h := range holds {
		env.MustApply(t, "place_hold", map[string]any{"idempotency_key": h + "-hold", "account_id": "again", "hold_id": h, "amount": 200, "currency": "EUR"})
		env.MustApply(t, "release_hold", map[string]any{"idempotency_key": h + "-release", "account_id": "again", "hold_id": h})
	}
	catchUp(t, env)
	first := run(t, env, audit.Options{SaveCheckpoint: true})
	if !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
	}
	exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT stream, (SELECT max(revision) + 1 FROM events WHERE stream = 'account-again'), gen_random_uuid(), type, data, metadata
		FROM events WHERE stream = 'account-again' AND type = 'HoldPlaced' AND convert_from(data, 'UTF8')::jsonb->>'hold_id' = 'again-h'`)
	catchUp(t, env)
	return placedAgainEnv{Env: env, checkpoint: first.Checkpoint.ID}
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
	if !inc.OK() || !slices.ContainsFunc(inc.From.Trusted, func(s string) bool { return strings.HasPrefix(s, "the holds table's rows of closed holds") }) || !full.Has(audit.InvReadModel, "read_model_mismatch") {
		t.Fatalf("a hold closed before the checkpoint edited: incremental ok %v, trusting %q; full: %v", inc.OK(), inc.From.Trusted, full.Violations)
	}
}
