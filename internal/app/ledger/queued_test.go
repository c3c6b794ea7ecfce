package ledger

import (
	"context"
	"fmt"
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
// its write folded (hotLeg.rec, lockedAccounts.keyRecord), which the pending
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
