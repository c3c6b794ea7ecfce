package audit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func TestReplayShowsTheStateAfterEachEvent(t *testing.T) {
	env := projtest.New(t)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o1", "account_id": "alice", "currency": "EUR", "overdraft_limit": 50})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o2", "account_id": "bob", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d1", "account_id": "alice", "amount": 100, "currency": "EUR"})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "h1", "account_id": "alice", "hold_id": "h1", "amount": 30, "currency": "EUR"})
	env.MustApply(t, "transfer", map[string]any{"idempotency_key": "t1", "transfer_id": "t1", "from": "alice", "to": "bob", "amount": 60, "currency": "EUR"})
	ctx := context.Background()

	var states []*audit.AccountState
	if err := audit.Replay(ctx, env.Store, "account-alice", -1, func(s audit.Step) error {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
		states = append(states, s.State.(*audit.AccountState))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(states) != 4 {
		t.Fatalf("%d states", len(states))
	}
	last := states[3]
	if last.Balance != 40 || last.Held != 30 || last.Available != 10 || last.Status != "open" || last.OverdraftLimit != 50 || len(last.Holds) != 1 || states[1].Balance != 100 {
		t.Fatalf("states: %+v / %+v", states[1], last)
	}
	n := 0
	if err := audit.Replay(ctx, env.Store, "account-alice", 1, func(audit.Step) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("--to-revision 1: %d events, %v", n, err)
	}
	var tr *audit.TransferState
	if err := audit.Replay(ctx, env.Store, "transfer-t1", -1, func(s audit.Step) error { tr = s.State.(*audit.TransferState); return s.Err }); err != nil || tr.Status != "completed" || tr.Amount != 60 {
		t.Fatalf("transfer: %+v, %v", tr, err)
	}
	env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": "x1", "transaction_id": "x1",
		"postings": []any{map[string]any{"from": "bob", "to": "alice", "amount": 25, "currency": "EUR"}}})
	var tx *reply.TransactionDetail
	if err := audit.Replay(ctx, env.Store, "transaction-x1", -1, func(s audit.Step) error { tx = s.State.(*reply.TransactionDetail); return s.Err }); err != nil ||
		tx.Status != "posted" || tx.IdempotencyKey != "x1" || len(tx.Postings) != 1 || len(tx.Accounts) != 2 {
		t.Fatalf("transaction: %+v, %v", tx, err)
	}
	var claim *audit.ClaimState
	if err := audit.Replay(ctx, env.Store, "key-t1", -1, func(s audit.Step) error { claim = s.State.(*audit.ClaimState); return s.Err }); err != nil || claim.Stream != "transfer-t1" {
		t.Fatalf("claim: %+v, %v", claim, err)
	}
	if err := audit.Replay(ctx, env.Store, "account-nobody", -1, func(audit.Step) error { return nil }); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("unknown stream: %v", err)
	}
	if err := audit.Replay(ctx, env.Store, "other-x", -1, func(audit.Step) error { return nil }); !errors.Is(err, audit.ErrUnknownStream) {
		t.Fatalf("foreign stream: %v", err)
	}

	// A tampered event stops the replay there, named.
	if _, err := env.Pool.Exec(ctx, `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":100', '"amount":101'), 'UTF8') WHERE stream = 'account-alice' AND revision = 1`); err != nil {
		t.Fatal(err)
	}
	var broken *audit.Step
	audit.Replay(ctx, env.Store, "account-alice", -1, func(s audit.Step) error {
		if s.Err != nil {
			broken = &s
		}
		return nil
	})
	if broken == nil || broken.Event.Revision != 1 {
		t.Fatalf("a tampered credit replayed: %+v", broken)
	}
}

// TestReplayOfALongStreamKeepsRecentKeysOnly: a stream of more commands than a
// replayed account keeps (1,024 keys) replays to the same state after every
// event as a fold that keeps every key, and counts every command decided.
func TestReplayOfALongStreamKeepsRecentKeysOnly(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	const n = 1500
	st, err := seed.Account(ctx, env.Store, "long", n, seed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	full := domain.NewAccount("long") // keeps every key
	i := 0
	err = audit.Replay(ctx, env.Store, st.Stream, -1, func(s audit.Step) error {
		if s.Err != nil {
			return s.Err
		}
		re := s.Event
		if err := domain.EvolveAccount(full, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Type: re.Type, Data: re.Data, Metadata: s.Metadata}); err != nil {
			return err
		}
		got := s.State.(*audit.AccountState)
		if got.Balance != full.Balance || got.Revision != full.Revision || got.Keys != i+1 {
			t.Fatalf("after event %d: replay %+v, full fold balance %d revision %d", i, got, full.Balance, full.Revision)
		}
		i++
		return nil
	})
	if err != nil || i != n || len(full.Keys) <= 1024 {
		t.Fatalf("replayed %d of %d events (%v); the full fold kept %d keys", i, n, err, len(full.Keys))
	}
}
