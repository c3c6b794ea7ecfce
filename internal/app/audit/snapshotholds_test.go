package audit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
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
			a.SetHold(&domain.Hold{ID: "sh-ghost", Amount: 7, Status: domain.HoldStatusReleased, Key: "sh-ghost-hold", Findable: true})
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
			if rep.Snapshots != 1 || rep.HoldsUnchecked != 0 {
				t.Fatalf("%s, the %s audit: %d snapshots, %d of them unchecked", c.name, name, rep.Snapshots, rep.HoldsUnchecked)
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

// TestAuditLetsARebuildSwitch: an audit paused after its fold, which checked
// a snapshot's closed holds against the holds read model, holds no lock on a
// read-model table, so a rebuild of accounts (its switch's lock timeout
// short) switches generation; the audit then ends in an error naming the
// switch, not in a false read_model_mismatch. (On f760149 the switch failed:
// the holds query had locked the old generation's holds table in the
// audit's transaction until its end.)
func TestAuditLetsARebuildSwitch(t *testing.T) {
	env, _ := closedHoldsEnv(t)
	writeSnapshotOf(t, env, "sh", func(a *domain.Account) {})
	events := int64(len(devtest.SettledAll(t, env.Store)))
	folded, resume := make(chan struct{}), make(chan struct{})
	var stop sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := audit.Run(context.Background(), env.Store, audit.Options{ReadModels: env.Pool, Progress: func(n, _ int64) {
			if n == events { // the fold's end, past the snapshot
				close(folded)
				<-resume
			}
		}})
		done <- err
	}()
	t.Cleanup(func() { stop.Do(func() { close(resume) }); <-done })
	select {
	case <-folded:
	case err := <-done:
		t.Fatalf("the audit ended before pausing at %d events: %v", events, err)
	}
	// The rebuild's own pool, as another process's: the paused audit holds
	// connections of env.Pool.
	pool, err := pgxpool.New(context.Background(), env.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = projections.Rebuild(context.Background(), pool, env.Store, projections.RebuildOptions{
		Projections: []string{projections.Accounts}, LockTimeout: 2 * time.Second, Check: audit.VerifyGeneration(pool, env.Store)})
	if err != nil {
		t.Fatalf("the rebuild's switch during the paused audit: %v", err)
	}
	stop.Do(func() { close(resume) })
	err = <-done
	done <- err // for the cleanup
	if err == nil || !strings.Contains(err.Error(), "switched read model accounts") || !strings.Contains(err.Error(), "rerun") {
		t.Fatalf("the audit across the switch: %v", err)
	}
}

// An audit of read models whose URL allows two connections
// (pool_max_conns=2) ends: the sets' session and the snapshot's tx hold both
// for the whole run, and the short reads beside them (the closed holds'
// check, the end's look for a switch) take a connection of their own. On
// 1690d19 each waited for a third of the pool's and the audit never ended.
func TestAuditOnATwoConnectionPool(t *testing.T) {
	env, _ := closedHoldsEnv(t)
	writeSnapshotOf(t, env, "sh", func(*domain.Account) {})
	sep := "?"
	if strings.Contains(env.URL, "?") {
		sep = "&"
	}
	pool, err := pgxpool.New(context.Background(), env.URL+sep+"pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The bound turns the old code's endless wait into a failure; an audit
	// of this history takes well under a second.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := audit.Run(ctx, env.Store, audit.Options{ReadModels: pool})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Snapshots != 1 || rep.HoldsUnchecked != 0 {
		t.Fatalf("ok %v, %d snapshots, %d unchecked: %v", rep.OK(), rep.Snapshots, rep.HoldsUnchecked, rep.Violations)
	}
}
