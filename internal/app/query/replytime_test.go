package query_test

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestReplyTimesExactly pins the text of every instant a query's reply
// names (PROTOCOL.md §2.3, §4), as the replies gave it before they shared
// one home: RFC 3339 in UTC, to the microsecond the read models keep, its
// trailing zeros dropped. The ledger's clock stands at
// 2026-11-22T10:00:00.001234567Z: the record time of both events.
func TestReplyTimesExactly(t *testing.T) {
	ctx := context.Background()
	env := projtest.New(t)
	clock := devtest.NewClock()
	clock.Advance(1234567 * time.Nanosecond)
	led := ledger.New(env.Store, ledger.Options{Clock: clock.Now})
	svc := projectedQueries(t, env)
	led.HandleRaw(ctx, "open_account", []byte(`{"idempotency_key":"o-rt","account_id":"rt-a","currency":"EUR"}`))
	d := led.HandleRaw(ctx, "deposit", []byte(`{"idempotency_key":"d-rt","account_id":"rt-a","amount":5,"currency":"EUR"}`))
	if d.Status != domain.StatusApplied {
		t.Fatalf("deposit: %+v", d)
	}
	const recorded = "2026-11-22T10:00:00.001234Z"
	rev := int64(1)
	b, qerr := svc.Balance(ctx, query.BalanceRequest{AccountID: "rt-a", Revision: &rev, MinPosition: d.Position})
	be, qerr2 := svc.Balance(ctx, query.BalanceRequest{AccountID: "rt-a", EffectiveAt: "2026-11-22T12:00:00.123456789+02:00", MinPosition: d.Position})
	if qerr != nil || qerr2 != nil || b.AsOf != recorded || be.AsOfEffective != "2026-11-22T10:00:00.123456Z" {
		t.Fatalf("query.balance: as_of %q (%v), as_of_effective %q (%v)", b.AsOf, qerr, be.AsOfEffective, qerr2)
	}
	g, qerr := svc.Balances(ctx, query.BalancesRequest{Prefix: "rt-", At: "2026-11-22T11:00:00.5+01:00", MinPosition: d.Position})
	ge, qerr2 := svc.Balances(ctx, query.BalancesRequest{Prefix: "rt-", EffectiveAt: "2026-11-22T10:00:01-00:00", MinPosition: d.Position})
	if qerr != nil || qerr2 != nil || g.AsOf != "2026-11-22T10:00:00.5Z" || ge.AsOfEffective != "2026-11-22T10:00:01Z" {
		t.Fatalf("query.balances: as_of %q (%v), as_of_effective %q (%v)", g.AsOf, qerr, ge.AsOfEffective, qerr2)
	}
	e, qerr := svc.Entries(ctx, query.EntriesRequest{AccountID: "rt-a", MinPosition: d.Position})
	if qerr != nil || len(e.Entries) != 1 || e.Entries[0].At != recorded || e.Entries[0].EffectiveAt != recorded {
		t.Fatalf("query.entries: %+v (%v), want one entry at and effective at %s", e, qerr, recorded)
	}
}
