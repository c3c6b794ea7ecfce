package ledger

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestBatchesOnAHotAccountWithFewKeys: batches of one hot account's deposits,
// sent at once to a service that keeps the records of 8 keys per account
// (Options.RecentKeys). A command's answer is read, after its commit, from
// the record its decision folded into the pending aggregate, which may have
// forgotten it by then (queuedHot.rec): every command is answered applied,
// the balances 1 to n each once. Read from the aggregate instead, a record
// was missing after its own append ("not found after its own append").
func TestBatchesOnAHotAccountWithFewKeys(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 8})
		defer s.Close()
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"hot","currency":"EUR"}`)
		const batches, size = 4, 50
		replies := make([][]Reply, batches)
		var wg sync.WaitGroup
		for b := range batches {
			var cmds []batchCmd
			for i := range size {
				cmds = append(cmds, batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("d%d-%d", b, i), "account_id": "hot", "amount": 1, "currency": "EUR"}})
			}
			wg.Go(func() { replies[b] = s.HandleBatch(context.Background(), batchBody(cmds), 0).Replies })
		}
		wg.Wait()
		var balances []int64
		for b, rs := range replies {
			for i, r := range rs {
				if r.Status != domain.StatusApplied || r.Account == nil {
					t.Fatalf("batch %d element %d: %+v", b, i, r)
				}
				balances = append(balances, r.Account.Balance)
			}
		}
		slices.Sort(balances)
		for i, b := range balances {
			if b != int64(i+1) {
				t.Fatalf("balances answered: %v, want 1 to %d each once", balances, batches*size)
			}
		}
	})
}

// TestCaptureToOnAHotAccountWithFewKeys: captures with `to` of holds on an
// account kept hot by batches of deposits, on a service that keeps the
// records of 8 keys per account. A capture pipelined on the held account
// gives up its lock while its write commits; it is answered from the record
// its write folded (accountStep.rec, from queuedHot.rec), which the pending
// aggregate may have forgotten by then: every capture is answered applied.
// Read from the aggregate instead, the capture dereferenced a nil record
// (copyRecord: a panic, the process down).
func TestCaptureToOnAHotAccountWithFewKeys(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 8})
		defer s.Close()
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"hot","currency":"EUR"}`)
		mustApply(t, s, "open_account", `{"idempotency_key":"ot","account_id":"to","currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"hot","amount":1000,"currency":"EUR"}`)
		const holds, batches, size = 30, 4, 50
		for h := range holds {
			mustApply(t, s, "place_hold", fmt.Sprintf(`{"idempotency_key":"h%d","account_id":"hot","hold_id":"h%d","amount":1,"currency":"EUR"}`, h, h))
		}
		var wg sync.WaitGroup
		for b := range batches {
			var cmds []batchCmd
			for i := range size {
				cmds = append(cmds, batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("d%d-%d", b, i), "account_id": "hot", "amount": 1, "currency": "EUR"}})
			}
			wg.Go(func() { s.HandleBatch(context.Background(), batchBody(cmds), 0) })
		}
		captures := make([]Reply, holds)
		for h := range holds {
			wg.Go(func() {
				captures[h] = send(s, "capture_hold", "idempotency_key", fmt.Sprintf("c%d", h), "account_id", "hot", "hold_id", fmt.Sprintf("h%d", h), "to", "to")
			})
		}
		wg.Wait()
		for h, r := range captures {
			if r.Status != domain.StatusApplied || r.Account == nil || r.IdempotencyKey != fmt.Sprintf("c%d", h) {
				t.Errorf("capture %d: %+v", h, r)
			}
		}
	})
}

// TestCaptureToOnTwoHotAccountsWithFewKeys: captures with `to` of holds on
// one account into another, both kept busy by deposits, on a service that
// keeps the record of 1 key per account. Whichever account a capture is
// pipelined on, the other is folded once the write commits and its lock
// given up until every lock is taken again (finishHot): the deposits waiting
// for it fold meanwhile and it forgets the capture's key. Every capture is
// answered applied, with the reply a resend gets (its original). Read from
// the aggregate after the locks are taken again (appendSteps keeps it as
// folded, accountStep.rec), a capture written was answered internal_error
// ("not found after its own append").
func TestCaptureToOnTwoHotAccountsWithFewKeys(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 1})
		defer s.Close()
		openHeldAndTo(t, s)
		mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"held","amount":1000,"currency":"EUR"}`)
		const holds = 30
		var cmds []batchCmd
		for h := range holds {
			mustApply(t, s, "place_hold", fmt.Sprintf(`{"idempotency_key":"h%d","account_id":"held","hold_id":"h%d","amount":1,"currency":"EUR"}`, h, h))
			cmds = append(cmds, batchCmd{"capture_hold", map[string]any{"idempotency_key": fmt.Sprintf("c%d", h), "account_id": "held", "hold_id": fmt.Sprintf("h%d", h), "to": "to"}})
		}
		answeredAsResentOnTwoHotAccounts(t, s, cmds)
	})
}

// TestMovesOnTwoHotAccountsWithFewKeys is
// TestCaptureToOnTwoHotAccountsWithFewKeys for the other writes over two
// accounts in one append (appendSteps): transfers, transactions and their
// refunds, each answered applied with the reply a resend gets. Their replies
// are built from the steps' records as folded (accountStep.rec) or, for a
// transaction, from its own stream's events; a transfer's step record
// missing would be read again from the store (stepRecord), so this guards
// the answer rather than showing the capture's error.
func TestMovesOnTwoHotAccountsWithFewKeys(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s := New(st, Options{Clock: clock, Logger: quietLog, RecentKeys: 1})
		defer s.Close()
		openHeldAndTo(t, s)
		mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"held","amount":1000,"currency":"EUR"}`)
		const moves = 10
		var cmds, refunds []batchCmd
		for i := range moves {
			tk, xk := fmt.Sprintf("t%d", i), fmt.Sprintf("x%d", i)
			cmds = append(cmds,
				batchCmd{"transfer", map[string]any{"idempotency_key": tk, "transfer_id": tk, "from": "held", "to": "to", "amount": 2, "currency": "EUR"}},
				batchCmd{"post_transaction", map[string]any{"idempotency_key": xk, "transaction_id": xk, "postings": []map[string]any{{"from": "held", "to": "to", "amount": 2, "currency": "EUR"}}}})
			refunds = append(refunds,
				batchCmd{"refund", map[string]any{"idempotency_key": "r" + tk, "original_key": tk, "amount": 1}},
				batchCmd{"refund", map[string]any{"idempotency_key": "r" + xk, "original_key": xk, "amount": 1}})
		}
		answeredAsResentOnTwoHotAccounts(t, s, cmds)
		answeredAsResentOnTwoHotAccounts(t, s, refunds)
	})
}

// openHeldAndTo opens the accounts "held" and "to".
func openHeldAndTo(t *testing.T, s *Service) {
	t.Helper()
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"held","currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ot","account_id":"to","currency":"EUR"}`)
}

// answeredAsResentOnTwoHotAccounts sends cmds at once while "held" and "to"
// take 100 and 200 deposits of their own, and checks that every one of cmds
// was answered applied, with the reply its resend gets.
func answeredAsResentOnTwoHotAccounts(t *testing.T, s *Service, cmds []batchCmd) {
	t.Helper()
	for i, r := range sendOnTwoHotAccounts(s, cmds, 100) {
		if r.Status != domain.StatusApplied {
			t.Errorf("%s %v: %+v", cmds[i].typ, cmds[i].body, r)
			continue
		}
		again := s.HandleRaw(context.Background(), cmds[i].typ, cmds[i].alone())
		again.Duplicate = false
		if !reflect.DeepEqual(again, r) {
			t.Errorf("%s %v answered %+v, its resend %+v", cmds[i].typ, cmds[i].body, r, again)
		}
	}
}

// sendOnTwoHotAccounts sends cmds at once while "held" and "to" take rounds
// and 2*rounds deposits of their own, and returns cmds' replies in order.
func sendOnTwoHotAccounts(s *Service, cmds []batchCmd, rounds int) []Reply {
	var wg sync.WaitGroup
	for i := range rounds {
		for j, acc := range []string{"held", "to", "to"} {
			wg.Go(func() {
				send(s, "deposit", "idempotency_key", fmt.Sprintf("%s-%s%d-%d", cmds[0].typ, acc, i, j), "account_id", acc, "amount", 1, "currency", "EUR")
			})
		}
	}
	replies := make([]Reply, len(cmds))
	for i, c := range cmds {
		wg.Go(func() { replies[i] = s.HandleRaw(context.Background(), c.typ, c.alone()) })
	}
	wg.Wait()
	return replies
}
