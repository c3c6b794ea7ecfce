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
