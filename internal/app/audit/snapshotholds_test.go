package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// closedHoldsEnv is a ledger where account "sh" placed holds sh-1 (with an
// expiry), sh-2 and sh-3 and released them (captured sh-2), then was audited clean with a
// checkpoint, then took a deposit after it; projected. The fold keeps of
// sh-1 and sh-2 nothing (of sh-3, its digest).
func closedHoldsEnv(t *testing.T) (*projtest.Env, int64) {
	t.Helper()
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 33})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "sh-open", "account_id": "sh", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "sh-dep", "account_id": "sh", "amount": 1000, "currency": "EUR"})
	for i, h := range []string{"sh-1", "sh-2", "sh-3"} {
		place := map[string]any{"idempotency_key": h + "-hold", "account_id": "sh", "hold_id": h, "amount": 100 * (i + 1), "currency": "EUR"}
		if i == 0 {
			place["expires_at"] = devtest.Epoch.Add(time.Hour).Format(time.RFC3339)
		}
		env.MustApply(t, "place_hold", place)
		if i == 1 {
			env.MustApply(t, "capture_hold", map[string]any{"idempotency_key": h + "-capture", "account_id": "sh", "hold_id": h, "amount": 150})
			continue
		}
		env.MustApply(t, "release_hold", map[string]any{"idempotency_key": h + "-release", "account_id": "sh", "hold_id": h})
	}
	catchUp(t, env)
	first := run(t, env, audit.Options{SaveCheckpoint: true})
	if !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
	}
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "sh-dep-2", "account_id": "sh", "amount": 5, "currency": "EUR"})
	catchUp(t, env)
	return env, first.Checkpoint.ID
}

// writeSnapshotOf writes the snapshot of account id's stream as the ledger
// keeps it (every hold, forgetting none), corrupted by corrupt, in place of
// any other, and returns the stream.
func writeSnapshotOf(t *testing.T, env *projtest.Env, id string, corrupt func(a *domain.Account)) string {
	t.Helper()
	ctx := context.Background()
	stream := domain.AccountStream(id)
	a := devtest.Account(t, env.Store, id)
	if len(a.Holds) != 3 || a.ForgotHolds() {
		t.Fatalf("the account's fold keeps %d holds, forgot %v", len(a.Holds), a.ForgotHolds())
	}
	corrupt(a)
	b, err := domain.EncodeSnapshot(stream, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, `DELETE FROM snapshots WHERE stream = $1`, stream); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.WriteSnapshot(ctx, eventstore.Snapshot{Stream: stream, Revision: uint64(a.Revision), Data: b}); err != nil {
		t.Fatal(err)
	}
	return stream
}

// TestAuditChecksEveryClosedHoldOfASnapshot: a snapshot written after the
// checkpoint, of an account that closed three holds, whose copy of an
// earlier closed hold (one the fold keeps nothing of) is invented, altered
// or deleted, is named by the full and the incremental audit, the hold in
// the message; the true snapshot passes both. (Loaded by the ledger, the
// invented hold would have place_hold of its ID answered hold_exists.)
func TestAuditChecksEveryClosedHoldOfASnapshot(t *testing.T) {
	env, cp := closedHoldsEnv(t)
	cases := []struct {
		name, hold string
		corrupt    func(a *domain.Account)
	}{
		{"true", "", func(a *domain.Account) {}},
		{"an invented closed hold", "sh-ghost", func(a *domain.Account) {
			a.Holds["sh-ghost"] = &domain.Hold{ID: "sh-ghost", Amount: 7, Status: domain.HoldStatusReleased, Key: "sh-ghost-hold", Findable: true}
		}},
		{"an earlier closed hold's amount altered", "sh-1", func(a *domain.Account) { a.Holds["sh-1"].Amount++ }},
		{"an earlier closed hold's key altered", "sh-2", func(a *domain.Account) { a.Holds["sh-2"].Key = "other-key" }},
		{"an earlier closed hold's status altered", "sh-2", func(a *domain.Account) { a.Holds["sh-2"].Status = domain.HoldStatusReleased }},
		{"an earlier closed hold's expiry altered", "sh-1", func(a *domain.Account) { a.Holds["sh-1"].ExpiresAt = a.Holds["sh-1"].ExpiresAt.Add(time.Second) }},
		{"an earlier closed hold deleted, the snapshot saying it forgot none", "sh-1", func(a *domain.Account) { delete(a.Holds, "sh-1") }},
	}
	for _, c := range cases {
		stream := writeSnapshotOf(t, env, "sh", c.corrupt)
		for name, opts := range map[string]audit.Options{"full": {}, "incremental": {From: &cp}} {
			rep := run(t, env, opts)
			if rep.Snapshots != 1 {
				t.Fatalf("%s, the %s audit: %d snapshots checked", c.name, name, rep.Snapshots)
			}
			if c.hold == "" {
				if !rep.OK() {
					t.Errorf("the true snapshot, the %s audit: %v", name, rep.Violations)
				}
				continue
			}
			named := false
			for _, v := range rep.Violations {
				named = named || (v.Invariant == audit.InvSnapshot && v.Kind == "snapshot_mismatch" && v.Stream == stream && strings.Contains(v.Message, "hold "+c.hold+" "))
			}
			if !named || rep.ViolationCount != 1 {
				t.Errorf("%s, the %s audit: hold %s not named alone: %v", c.name, name, c.hold, rep.Violations)
			}
		}
	}
}

// TestAuditCountsSnapshotHoldsItCannotCheck: a snapshot past the holds read
// model's checkpoint (the projector behind it) has its closed holds counted
// unchecked, not named; one the read model has reached is checked.
func TestAuditCountsSnapshotHoldsItCannotCheck(t *testing.T) {
	env, _ := closedHoldsEnv(t)
	writeSnapshotOf(t, env, "sh", func(a *domain.Account) {})
	if rep := run(t, env, audit.Options{}); !rep.OK() || rep.Snapshots != 1 || rep.HoldsUnchecked != 0 {
		t.Fatalf("a snapshot the read model reached: ok %v, %d checked, %d unchecked: %v", rep.OK(), rep.Snapshots, rep.HoldsUnchecked, rep.Violations)
	}
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "sh-dep-3", "account_id": "sh", "amount": 5, "currency": "EUR"})
	writeSnapshotOf(t, env, "sh", func(a *domain.Account) { a.Holds["sh-1"].Amount++ })
	rep := run(t, env, audit.Options{})
	if !rep.OK() || rep.Snapshots != 1 || rep.HoldsUnchecked != 1 {
		t.Fatalf("a snapshot past the read model: ok %v, %d checked, %d unchecked: %v", rep.OK(), rep.Snapshots, rep.HoldsUnchecked, rep.Violations)
	}
}
