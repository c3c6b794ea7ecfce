package query_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestBalanceByEffectiveTimeMatchesAFold (PROTOCOL.md §2.3), a property test:
// over a random history of two accounts opened effective long ago, with
// deposits, withdrawals, transfers and holds of which a share is backdated at
// random, ledger.v1.query.balance with effective_at, at, just before and just
// after every event's effective time, equals a fold of the account's events
// sorted by effective time (ties by record order) that reads only their
// amounts; before the opening it is account_not_found. query.entries by
// effective time keeps exactly the entries effective in [from, to), in record
// order. The read models are PostgreSQL's, fed from every event store the
// projector reads: memory, PostgreSQL and KurrentDB (its in-process test
// server; transfers run there as sagas).
func TestBalanceByEffectiveTimeMatchesAFold(t *testing.T) {
	for _, backend := range []string{"memory", "postgres", "kurrentdb"} {
		t.Run(backend, func(t *testing.T) {
			env := projtest.New(t)
			var st eventstore.Store = env.Store
			led := env.Ledger
			switch backend {
			case "memory":
				st = devtest.Memory(t)
			case "kurrentdb":
				st = devtest.KurrentDB(t)
			}
			if backend != "postgres" {
				led = ledger.New(st, ledger.Options{Clock: devtest.NewTickingClock(time.Millisecond).Now})
			}
			last := writeBackdatedHistory(t, led, rand.New(rand.NewPCG(20261126, 25)))
			r, err := projections.NewRunner(env.Pool, st, projections.Options{PollInterval: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			devtest.Go(t, r.Run)
			svc := query.New(env.Pool, query.Options{MaxWait: 20 * time.Second})
			if _, qerr := svc.Balance(context.Background(), query.BalanceRequest{AccountID: "a", MinPosition: last}); qerr != nil {
				t.Fatal(qerr)
			}
			for _, id := range []string{"a", "b"} {
				events := effectiveEvents(t, st, id)
				checkBalancesByEffectiveTime(t, svc, id, events, last)
				checkEntriesByEffectiveTime(t, svc, id, events, last)
			}
		})
	}
}

// opened is when the history's accounts opened in the world.
var opened = devtest.Epoch.Add(-1000 * time.Hour)

// writeBackdatedHistory opens a and b (overdraft 300) effective at opened, and
// sends 150 random commands, 40% of them effective at a random earlier time
// (in whole microseconds, as PostgreSQL keeps them); it returns the position
// of the last one.
func writeBackdatedHistory(t *testing.T, led *ledger.Service, rng *rand.Rand) string {
	t.Helper()
	ctx := context.Background()
	send := func(typ, body string) ledger.Reply {
		return led.HandleRaw(ctx, typ, []byte(body))
	}
	for _, id := range []string{"a", "b"} {
		if r := send("open_account", fmt.Sprintf(`{"idempotency_key":"o-%s","account_id":%q,"currency":"EUR","overdraft_limit":300,"effective_at":%q}`, id, id, opened.Format(time.RFC3339Nano))); r.Status != domain.StatusApplied {
			t.Fatalf("open %s: %+v", id, r)
		}
	}
	var holds []string
	pos := ""
	for i := range 150 {
		key, amount, acc := fmt.Sprintf("k-%d", i), 1+rng.IntN(300), []string{"a", "b"}[rng.IntN(2)]
		eff := ""
		if rng.IntN(10) < 4 {
			at := opened.Add(time.Duration(rng.Int64N(int64(1000*time.Hour))) / time.Microsecond * time.Microsecond)
			eff = fmt.Sprintf(`,"effective_at":%q`, at.Format(time.RFC3339Nano))
		}
		var r ledger.Reply
		switch k := rng.IntN(10); {
		case k < 3:
			r = send("deposit", fmt.Sprintf(`{"idempotency_key":%q,"account_id":%q,"amount":%d,"currency":"EUR"%s}`, key, acc, amount, eff))
		case k < 5:
			r = send("withdraw", fmt.Sprintf(`{"idempotency_key":%q,"account_id":%q,"amount":%d,"currency":"EUR"%s}`, key, acc, amount, eff))
		case k < 7:
			r = send("transfer", fmt.Sprintf(`{"idempotency_key":%q,"transfer_id":%q,"from":%q,"to":%q,"amount":%d,"currency":"EUR"%s}`, key, key, acc, map[string]string{"a": "b", "b": "a"}[acc], amount, eff))
		case k < 8 || len(holds) == 0:
			r = send("place_hold", fmt.Sprintf(`{"idempotency_key":%q,"account_id":"a","hold_id":%q,"amount":%d,"currency":"EUR"%s}`, key, key, amount, eff))
			if r.Status == domain.StatusApplied {
				holds = append(holds, key)
			}
		default:
			typ, extra := "release_hold", ""
			if k == 9 {
				typ, extra = "capture_hold", eff
			}
			r = send(typ, fmt.Sprintf(`{"idempotency_key":%q,"account_id":"a","hold_id":%q%s}`, key, holds[0], extra))
			holds = holds[1:]
		}
		if r.Status == domain.StatusError || r.Status == domain.StatusInvalid {
			t.Fatalf("%s: %+v", key, r)
		}
		pos = r.Position
	}
	return pos
}

// effectiveEvent is an account event as the fold by effective time reads it:
// its effective time (as PostgreSQL keeps it), its revision, what it changes.
type effectiveEvent struct {
	effective     time.Time
	rev           int64
	id            string
	money         bool // a statement entry
	balance, held int64
}

// effectiveEvents reads an account's events with what each changes, from its
// amounts alone (not the balances it states).
func effectiveEvents(t *testing.T, st eventstore.StreamReader, id string) []effectiveEvent {
	t.Helper()
	recs, err := st.ReadStream(context.Background(), domain.AccountStream(id), 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []effectiveEvent
	for _, re := range recs {
		m, err := domain.DecodeMetadata(re.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		p, err := domain.DecodeEvent(re.Type, re.Data)
		if err != nil {
			t.Fatal(err)
		}
		e := effectiveEvent{effective: domain.EffectiveTime(m).UTC().Truncate(time.Microsecond), rev: int64(re.Revision), id: re.ID.String()}
		switch p := p.(type) {
		case *domain.Credited:
			e.balance, e.money = p.Amount, true
		case *domain.Debited:
			e.balance, e.money = -p.Amount, true
		case *domain.HoldPlaced:
			e.held = p.Amount
		case *domain.HoldCaptured:
			e.balance, e.held, e.money = -p.Amount, -(p.Amount + p.Released), true
		case *domain.HoldReleased:
			e.held = -p.Amount
		}
		out = append(out, e)
	}
	return out
}

// checkBalancesByEffectiveTime asks the balance by effective time at, just
// before and just after every event's effective time, each once the read
// model it reads has reached last (each projection keeps its own checkpoint).
func checkBalancesByEffectiveTime(t *testing.T, svc *query.Service, id string, events []effectiveEvent, last string) {
	t.Helper()
	sorted := slices.Clone(events)
	slices.SortStableFunc(sorted, func(x, y effectiveEvent) int { return x.effective.Compare(y.effective) }) // ties: record order
	for _, ev := range events {
		for _, instant := range []time.Time{ev.effective, ev.effective.Add(-time.Microsecond), ev.effective.Add(time.Microsecond)} {
			var balance, held int64
			seen := false
			for _, e := range sorted {
				if e.effective.After(instant) {
					break
				}
				balance, held, seen = balance+e.balance, held+e.held, true
			}
			got, qerr := svc.Balance(context.Background(), query.BalanceRequest{AccountID: id, EffectiveAt: instant.Format(time.RFC3339Nano), MinPosition: last})
			switch {
			case !seen:
				if qerr == nil || qerr.Code != domain.CodeAccountNotFound {
					t.Fatalf("%s effective %s, before its opening: %+v %+v", id, instant, got, qerr)
				}
			case qerr != nil:
				t.Fatalf("%s effective %s: %+v", id, instant, qerr)
			case got.Balance != balance || got.Held != held || got.Available != balance-held || got.AsOfRevision != nil ||
				got.AsOfEffective != instant.UTC().Format(time.RFC3339Nano):
				t.Fatalf("%s effective %s: %+v, the fold by effective time: balance %d held %d", id, instant, got, balance, held)
			}
		}
	}
}

// checkEntriesByEffectiveTime asks the entries effective within a few windows,
// once the entries projection has reached last: the balance asked before
// waited for the accounts projection only, and the entries one may lag it.
func checkEntriesByEffectiveTime(t *testing.T, svc *query.Service, id string, events []effectiveEvent, last string) {
	t.Helper()
	for _, w := range [][2]time.Time{{opened, devtest.Epoch}, {opened.Add(200 * time.Hour), opened.Add(600 * time.Hour)}, {opened.Add(900 * time.Hour), devtest.Epoch.Add(time.Hour)}} {
		var want []string
		for _, e := range events {
			if e.money && !e.effective.Before(w[0]) && e.effective.Before(w[1]) {
				want = append(want, e.id)
			}
		}
		var got []string
		after := int64(-1)
		for {
			limit := 7
			page, qerr := svc.Entries(context.Background(), query.EntriesRequest{AccountID: id, AfterRevision: &after, Limit: &limit,
				From: w[0].Format(time.RFC3339Nano), To: w[1].Format(time.RFC3339Nano), By: query.ByEffective, MinPosition: last})
			if qerr != nil {
				t.Fatal(qerr)
			}
			for _, e := range page.Entries {
				got = append(got, e.EventID)
			}
			if page.NextAfterRevision == nil {
				break
			}
			after = *page.NextAfterRevision
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%s entries effective in [%s, %s): %d entries, want %d:\n got %v\nwant %v", id, w[0], w[1], len(got), len(want), got, want)
		}
	}
}
