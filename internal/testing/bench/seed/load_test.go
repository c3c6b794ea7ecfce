package seed_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestOpenAccountsLoaded: accounts opened on PostgreSQL through bulk loads (three
// of them, the last one short) are all there, each with its key's claim, and
// are the accounts a ledger over the store finds: each takes a deposit at the revision after its opening, and an
// opening sent again is answered as the duplicate it is (its key's claim and
// record were loaded with it).
func TestOpenAccountsLoaded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := devtest.Postgres(t)
	const n = 2500
	body := func(i int) []byte {
		return fmt.Appendf(nil, `{"idempotency_key":"open-l%d","account_id":"l%d","currency":"EUR"}`, i, i)
	}
	if err := seed.OpenAccounts(ctx, store, n, seed.OpenOptions{Body: body, Chunk: 1000}); err != nil {
		t.Fatal(err)
	}
	for i := range n { // every account and its key's claim, once
		for _, stream := range []string{domain.AccountStream(fmt.Sprintf("l%d", i)), domain.KeyStream(fmt.Sprintf("open-l%d", i))} {
			evs, err := store.ReadStream(ctx, stream, 0, eventstore.Forwards, 2)
			if err != nil || len(evs) != 1 {
				t.Fatalf("%s: %d events, %v", stream, len(evs), err)
			}
		}
	}
	svc := ledger.New(store, ledger.Options{})
	defer svc.Close()
	for _, i := range []int{0, 999, 1000, 2000, n - 1} {
		r := svc.HandleRaw(ctx, string(domain.CmdOpenAccount), body(i))
		if r.Status != domain.StatusApplied || !r.Duplicate {
			t.Fatalf("account %d opened again: %s %s duplicate=%v", i, r.Status, r.Code, r.Duplicate)
		}
		dep := fmt.Appendf(nil, `{"idempotency_key":"dep-l%d","account_id":"l%d","amount":5,"currency":"EUR"}`, i, i)
		r = svc.HandleRaw(ctx, string(domain.CmdDeposit), dep)
		if r.Status != domain.StatusApplied || r.Duplicate || len(r.Events) != 1 || r.Events[0].Revision != 1 {
			t.Fatalf("a deposit into account %d: %s %s duplicate=%v events %+v", i, r.Status, r.Code, r.Duplicate, r.Events)
		}
	}
	r := svc.HandleRaw(ctx, string(domain.CmdDeposit), []byte(`{"idempotency_key":"dep-none","account_id":"l2500","amount":5,"currency":"EUR"}`))
	if r.Code != domain.CodeAccountNotFound {
		t.Fatalf("a deposit into account %d, never opened: %s %s", n, r.Status, r.Code)
	}
}
