package query_test

import (
	"context"
	"fmt"
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

// projectedQueries runs the projector over env's store and returns the
// queries on its read models.
func projectedQueries(t *testing.T, env *projtest.Env) *query.Service {
	t.Helper()
	runner, err := projections.NewRunner(env.Pool, env.Store, projections.Options{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Go(t, runner.Run)
	return query.New(env.Pool, query.Options{MaxWait: 20 * time.Second})
}

// TestEffectiveAtBelowTheMicrosecondHasOneAnswer (PROTOCOL.md §2.3):
// effective_at with a fraction below the microsecond, which RFC 3339 allows
// and PostgreSQL's timestamptz does not keep. An account opened effective at
// E+700ns and a deposit effective at E+300ns: the ledger decides on the
// instant its read models answer by (E, truncated), so the deposit is not
// refused as earlier than the opening while query.balance at E+300ns finds
// the account; it is applied, and the balance at that instant includes it.
// Its events record E, the entry answers E; an exact resend is a duplicate,
// to this ledger and to one started again on the same store, and a resend
// with E+1µs is idempotency_key_conflict naming effective_at.
func TestEffectiveAtBelowTheMicrosecondHasOneAnswer(t *testing.T) {
	ctx := context.Background()
	env := projtest.New(t)
	e := opened.Truncate(time.Second)
	at := func(ns int) string { return e.Add(time.Duration(ns)).Format(time.RFC3339Nano) }
	send := func(led *ledger.Service, typ, body string) ledger.Reply { return led.HandleRaw(ctx, typ, []byte(body)) }
	svc := projectedQueries(t, env)
	o := send(env.Ledger, "open_account", fmt.Sprintf(`{"idempotency_key":"o-n","account_id":"n","currency":"EUR","effective_at":%q}`, at(700)))
	if o.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", o)
	}
	_, before := svc.Balance(ctx, query.BalanceRequest{AccountID: "n", EffectiveAt: at(300), MinPosition: o.Position})
	deposit := fmt.Sprintf(`{"idempotency_key":"d-n","account_id":"n","amount":100,"currency":"EUR","effective_at":%q}`, at(300))
	r := send(env.Ledger, "deposit", deposit)
	if r.Status != domain.StatusApplied || before != nil {
		t.Fatalf("query.balance effective at %s, after the opening effective at %s: %+v; a deposit effective then: %+v", at(300), at(700), before, r)
	}
	last := r.Position
	for _, led := range []*ledger.Service{env.Ledger, ledger.New(env.Store, ledger.Options{Clock: devtest.NewTickingClock(time.Millisecond).Now})} {
		if again := send(led, "deposit", deposit); again.Status != domain.StatusApplied || !again.Duplicate {
			t.Errorf("the exact resend: %+v, want the duplicate", again)
		}
	}
	other := fmt.Sprintf(`{"idempotency_key":"d-n","account_id":"n","amount":100,"currency":"EUR","effective_at":%q}`, at(1300))
	if c := send(env.Ledger, "deposit", other); c.Code != domain.CodeIdempotencyKeyConflict || !slices.Equal(c.Fields, []string{"effective_at"}) {
		t.Errorf("a resend effective a microsecond later: %+v, want idempotency_key_conflict naming effective_at", c)
	}
	recs, err := env.Store.ReadStream(ctx, domain.AccountStream("n"), 0, eventstore.Forwards, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range recs {
		m, err := domain.DecodeMetadata(re.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		if m.EffectiveAt == nil || !m.EffectiveAt.Equal(e) {
			t.Errorf("event %d (%s) records effective_at %v, want %s", re.Revision, re.Type, m.EffectiveAt, e.Format(time.RFC3339Nano))
		}
	}

	b, qerr := svc.Balance(ctx, query.BalanceRequest{AccountID: "n", EffectiveAt: at(300), MinPosition: last})
	if qerr != nil || b.Balance != 100 {
		t.Errorf("query.balance effective at %s: %+v %+v, want balance 100", at(300), b, qerr)
	}
	page, qerr := svc.Entries(ctx, query.EntriesRequest{AccountID: "n", MinPosition: last})
	if qerr != nil || len(page.Entries) != 1 || page.Entries[0].EffectiveAt != e.Format(time.RFC3339Nano) {
		t.Errorf("query.entries: %+v %+v, want one entry effective at %s", page, qerr, e.Format(time.RFC3339Nano))
	}
}

// TestOpeningRecordedBelowTheMicrosecond (PROTOCOL.md §2.3): an account opened
// without effective_at is effective from its record time, which the ledger's
// clock gives to the nanosecond and the read models keep to the microsecond.
// A deposit effective at that opening as the ledger answers it (its entry's,
// its balance history's instant) is applied, as query.balance at that
// instant finds the account: one answer to whether it was open then.
func TestOpeningRecordedBelowTheMicrosecond(t *testing.T) {
	ctx := context.Background()
	env := projtest.New(t)
	led := ledger.New(env.Store, ledger.Options{Clock: devtest.NewTickingClock(time.Millisecond + 300*time.Nanosecond).Now})
	svc := projectedQueries(t, env)
	o := led.HandleRaw(ctx, "open_account", []byte(`{"idempotency_key":"o-m","account_id":"m","currency":"EUR"}`))
	if o.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", o)
	}
	opening := int64(0) // its revision; as_of is its record time as the read model keeps it
	b, qerr := svc.Balance(ctx, query.BalanceRequest{AccountID: "m", Revision: &opening, MinPosition: o.Position})
	if qerr != nil {
		t.Fatal(qerr)
	}
	eff, err := time.Parse(time.RFC3339Nano, b.AsOf)
	if err != nil {
		t.Fatalf("as_of %q: %v", b.AsOf, err)
	}
	_, found := svc.Balance(ctx, query.BalanceRequest{AccountID: "m", EffectiveAt: eff.Format(time.RFC3339Nano), MinPosition: o.Position})
	d := led.HandleRaw(ctx, "deposit", []byte(fmt.Sprintf(`{"idempotency_key":"d-m","account_id":"m","amount":7,"currency":"EUR","effective_at":%q}`, eff.Format(time.RFC3339Nano))))
	if found != nil || d.Status != domain.StatusApplied {
		t.Fatalf("query.balance effective at the opening as answered, %s: %+v; a deposit effective then: %+v", eff.Format(time.RFC3339Nano), found, d)
	}
}

// TestAsOfEffectiveIsTheInstantUsed (PROTOCOL.md §2.3, §4): a query's
// effective_at with a fraction below the microsecond is answered as of the
// microsecond below it (the read models keep no finer), and as_of_effective
// is that instant, not the text asked; over NATS, for query.balance and
// query.balances. A deposit effective at E and one at E+1µs: asked at
// E+999ns, both answer the first deposit alone and echo E.
func TestAsOfEffectiveIsTheInstantUsed(t *testing.T) {
	ctx := context.Background()
	f := setup(t, 5*time.Second)
	f.start(t)
	e := opened.Truncate(time.Second).Add(time.Hour)
	send := func(body string) ledger.Reply {
		r := f.env.Ledger.HandleRaw(ctx, "deposit", []byte(body))
		if r.Status != domain.StatusApplied {
			t.Fatalf("%s: %+v", body, r)
		}
		return r
	}
	if o := f.env.Ledger.HandleRaw(ctx, "open_account", []byte(fmt.Sprintf(`{"idempotency_key":"o-u","account_id":"u:1","currency":"EUR","effective_at":%q}`, opened.Format(time.RFC3339Nano)))); o.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", o)
	}
	send(fmt.Sprintf(`{"idempotency_key":"d-u1","account_id":"u:1","amount":10,"currency":"EUR","effective_at":%q}`, e.Format(time.RFC3339Nano)))
	last := send(fmt.Sprintf(`{"idempotency_key":"d-u2","account_id":"u:1","amount":5,"currency":"EUR","effective_at":%q}`, e.Add(time.Microsecond).Format(time.RFC3339Nano))).Position
	asked, used := e.Add(999*time.Nanosecond).Format(time.RFC3339Nano), e.Format(time.RFC3339Nano)
	b := f.ask(t, "balance", map[string]any{"account_id": "u:1", "effective_at": asked, "min_position": last})
	if b["balance"] != 10.0 || b["as_of_effective"] != used {
		t.Errorf("query.balance effective at %s: %v, want balance 10 as_of_effective %s", asked, b, used)
	}
	s := f.ask(t, "balances", map[string]any{"prefix": "u:", "effective_at": asked, "min_position": last})
	rows, _ := s["balances"].([]any)
	if len(rows) != 1 || rows[0].(map[string]any)["balance"] != 10.0 || s["as_of_effective"] != used {
		t.Errorf("query.balances effective at %s: %v, want balance 10 as_of_effective %s", asked, s, used)
	}
}

// TestTimesBelowTheMicrosecondAsSent (PROTOCOL.md §2.3, §4): a query's times
// are ordered as sent and used to the microsecond. Over NATS: an entries
// range inside one microsecond (from E+100ns to E+900ns) is valid and
// empty, the same range reversed is invalid_request naming to; a balance
// asked effective before the account's first event is account_not_found
// naming the instant used (the microsecond below), not the text sent.
func TestTimesBelowTheMicrosecondAsSent(t *testing.T) {
	ctx := context.Background()
	f := setup(t, 5*time.Second)
	f.start(t)
	e := opened.Truncate(time.Second).Add(time.Hour)
	at := func(ns int) string { return e.Add(time.Duration(ns)).Format(time.RFC3339Nano) }
	if o := f.env.Ledger.HandleRaw(ctx, "open_account", []byte(fmt.Sprintf(`{"idempotency_key":"o-s","account_id":"s","currency":"EUR","effective_at":%q}`, at(0)))); o.Status != domain.StatusApplied {
		t.Fatalf("open: %+v", o)
	}
	d := f.env.Ledger.HandleRaw(ctx, "deposit", []byte(fmt.Sprintf(`{"idempotency_key":"d-s","account_id":"s","amount":3,"currency":"EUR","effective_at":%q}`, at(0))))
	if d.Status != domain.StatusApplied {
		t.Fatalf("deposit: %+v", d)
	}
	page := f.ask(t, "entries", map[string]any{"account_id": "s", "by": "effective", "from": at(100), "to": at(900), "min_position": d.Position})
	if page["status"] == "invalid" || page["entries"] == nil || len(page["entries"].([]any)) != 0 {
		t.Errorf("entries from %s to %s: %v, want an empty page", at(100), at(900), page)
	}
	rev := f.ask(t, "entries", map[string]any{"account_id": "s", "by": "effective", "from": at(900), "to": at(100), "min_position": d.Position})
	if rev["code"] != "invalid_request" || !slices.Equal(rev["fields"].([]any), []any{"to"}) {
		t.Errorf("entries from %s to %s: %v, want invalid_request naming to", at(900), at(100), rev)
	}
	used := e.Add(-time.Microsecond).Format(time.RFC3339Nano)
	b := f.ask(t, "balance", map[string]any{"account_id": "s", "effective_at": at(-100), "min_position": d.Position})
	if b["code"] != "account_not_found" || !strings.HasSuffix(b["message"].(string), "before "+used) {
		t.Errorf("query.balance effective at %s: %v, want account_not_found naming %s", at(-100), b, used)
	}
}
