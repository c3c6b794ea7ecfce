package ledger

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// TestColdLoadsGroupedMatchStreamByStream: aggregates loaded cold by many
// concurrent callers, in grouped reads (eventstore.ColdReader), are the ones
// a load stream by stream gives: streams longer than a grouped read's page
// with and without a snapshot, a short one, and one that does not exist,
// each asked by several callers at once.
func TestColdLoadsGroupedMatchStreamByStream(t *testing.T) {
	st := memory.New()
	seed := New(st, Options{Clock: clock, SnapshotEvery: 400})
	lengths := map[string]int{"long": coldPage + 40, "snap": 2*coldPage + 10, "short": 3}
	for id, n := range lengths {
		mustApply(t, seed, "open_account", fmt.Sprintf(`{"idempotency_key":"o-%s","account_id":%q,"currency":"EUR","overdraft_limit":100000}`, id, id))
		for i := 1; i < n; i++ {
			typ := "deposit"
			if i%3 == 0 {
				typ = "withdraw"
			}
			mustApply(t, seed, typ, fmt.Sprintf(`{"idempotency_key":"%s-%d","account_id":%q,"amount":%d,"currency":"EUR"}`, id, i, id, i))
		}
	}
	seed.Close()
	ctx := context.Background()
	if snap, err := st.ReadSnapshot(ctx, "account-snap"); err != nil || snap.Revision != 399 {
		t.Fatalf("snapshot of snap: %+v, %v", snap, err)
	}
	opts := Options{Clock: clock, RecentKeys: 50}
	grouped := New(st, opts)
	defer grouped.Close()
	if _, ok := grouped.cold.(*groupedCold); !ok {
		t.Fatalf("the memory store's cold loads are %T, not grouped", grouped.cold)
	}
	one := New(st, opts)
	defer one.Close()
	ids := []string{"long", "snap", "short", "none"}
	got := make([][]*domain.Account, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		got[i] = make([]*domain.Account, 8)
		for j := range got[i] {
			wg.Go(func() {
				acc, err := grouped.cold.load(ctx, domain.AccountStream(id), id)
				if err != nil {
					t.Errorf("%s: %v", id, err)
				}
				got[i][j] = acc
			})
		}
	}
	wg.Wait()
	for i, id := range ids {
		want, err := streamByStream{one}.load(ctx, domain.AccountStream(id), id)
		if err != nil {
			t.Fatal(err)
		}
		for _, acc := range got[i] {
			if acc == nil {
				t.Fatalf("%s: no aggregate", id)
			}
			if acc.Revision != want.Revision || acc.Balance != want.Balance || acc.LastChain != want.LastChain || len(acc.Keys) != len(want.Keys) ||
				acc.Forgot() != want.Forgot() || acc.SnapshotRevision != want.SnapshotRevision || acc.Opened != want.Opened {
				t.Fatalf("%s: grouped %+v, stream by stream %+v", id, acc, want)
			}
		}
		if n := lengths[id]; want.Revision != int64(n)-1 {
			t.Fatalf("%s: revision %d, want %d", id, want.Revision, n-1)
		}
	}
}
