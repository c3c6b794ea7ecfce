package query_test

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections"
)

// groupAccounts are the accounts of the group balances test: IDs that a LIKE
// pattern would confuse ('_' and '.' are one-character wildcards there; "mX1"
// and "m.1" are what "m_1" would match), shorter and longer IDs sharing a
// prefix, two currencies, a closed account and an overdrawn one.
var groupAccounts = []struct{ id, currency string }{
	{"m_1:a", "EUR"}, {"m_1:b", "USD"}, {"m_1:c", "EUR"}, {"m_1:d:e", "EUR"},
	{"m_1", "EUR"}, {"m_10", "EUR"}, {"mX1:a", "EUR"}, {"m.1:a", "EUR"}, {"m_", "USD"},
}

// groupPrefixes are the prefixes asked: each group above, one matching none.
var groupPrefixes = []string{"m_1:", "m_1:d", "m_1", "m_", "m", "mX", "m.", "m_1:a", "n"}

// TestGroupBalancesEqualTheSumOfAccounts (PROTOCOL.md v1.2 query.balances):
// over every prefix, the sums per currency equal the sums of query.account
// over the accounts whose ID starts with it (a prefix matches literally), live
// and after a rebuild; as of each event's time, and by effective time at each
// event's and each backdated time, they equal the sums of query.balance asked
// the same; over HTTP they are the same; bad requests are invalid_request
// naming the field.
func TestGroupBalancesEqualTheSumOfAccounts(t *testing.T) {
	f := setup(t, 10*time.Second)
	last := writeGroup(t, f)
	f.start(t)

	f.checkGroupSums(t, "live", last)
	f.checkGroupSumsAsOf(t, last, 1)
	code, h, _ := f.get(t, "/v1/balances?prefix="+url.QueryEscape("m_1:")+"&currency=EUR")
	if want := f.ask(t, "balances", map[string]any{"prefix": "m_1:", "currency": "EUR"}); code != 200 || !reflect.DeepEqual(h, want) {
		t.Fatalf("GET /v1/balances: %d %v, want %v", code, h, want)
	}
	f.checkGroupRefusals(t)

	res, err := projections.Rebuild(context.Background(), f.env.Pool, f.env.Store, projections.RebuildOptions{Check: audit.VerifyGeneration(f.env.Pool, f.env.Store)})
	if err != nil {
		t.Fatal(err)
	}
	f.checkPrefixIndexes(t, res)
	f.checkGroupSums(t, "after a rebuild", last)
	f.checkGroupSumsAsOf(t, last, 4)
	f.checkSumOverflow(t)
}

// checkSumOverflow: a sum beyond the int64 range is amount_overflow, never
// wrapped. Two accounts with 9e18 each are written straight into the accounts
// read model (they have no events: the rebuild is done by then).
func (f *fixture) checkSumOverflow(t *testing.T) {
	t.Helper()
	if _, err := f.env.Pool.Exec(context.Background(), `INSERT INTO readmodel.accounts
		(account_id, currency, overdraft_limit, status, balance, held, revision, opened_at, updated_at)
		SELECT 'big:' || i, 'EUR', 0, 'open', 9000000000000000000, 0, 0, now(), now() FROM generate_series(1, 2) i`); err != nil {
		t.Fatal(err)
	}
	if r := f.ask(t, "balances", map[string]any{"prefix": "big:1"}); !reflect.DeepEqual(r["balances"], []any{map[string]any{
		"currency": "EUR", "balance": 9e18, "held": 0.0, "available": 9e18, "accounts": 1.0}}) {
		t.Fatalf("one account of 9e18: %v", r)
	}
	if r := f.ask(t, "balances", map[string]any{"prefix": "big:"}); r["code"] != "amount_overflow" || r["status"] != "rejected" {
		t.Fatalf("two accounts of 9e18: %v, want amount_overflow", r)
	}
}

// groupEffective are the effective times of writeGroup's backdated
// commands (§2.3): before the test clock's first record time.
var groupEffective = []time.Time{
	time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),   // half the accounts' openings
	time.Date(2026, 11, 5, 12, 0, 0, 0, time.UTC),  // a hold placed late
	time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC), // deposits and a transfer settled late
}

// writeGroup opens groupAccounts (every other one effective earlier) and
// moves money among them: deposits, a hold, a transfer out of the group, an
// overdraft, an account emptied and closed, and some of it booked late
// (groupEffective). It returns the last write's position.
func writeGroup(t *testing.T, f *fixture) string {
	t.Helper()
	eff := func(i int) string { return groupEffective[i].Format(time.RFC3339Nano) }
	for i, a := range groupAccounts {
		open := map[string]any{"idempotency_key": "o-" + a.id, "account_id": a.id, "currency": a.currency, "overdraft_limit": 500}
		if i%2 == 0 {
			open["effective_at"] = eff(0)
		}
		f.env.MustApply(t, "open_account", open)
		f.env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-" + a.id, "account_id": a.id, "amount": 100 * (i + 1), "currency": a.currency})
	}
	steps := []struct {
		typ  string
		body map[string]any
	}{
		{"place_hold", map[string]any{"account_id": "m_1:a", "hold_id": "h1", "amount": 40, "currency": "EUR", "effective_at": eff(1)}},
		{"transfer", map[string]any{"transfer_id": "t1", "from": "m_1:a", "to": "mX1:a", "amount": 30, "currency": "EUR"}},
		{"withdraw", map[string]any{"account_id": "m_1:d:e", "amount": 700, "currency": "EUR"}},
		{"withdraw", map[string]any{"account_id": "m_1:c", "amount": 300, "currency": "EUR"}},
		{"close_account", map[string]any{"account_id": "m_1:c"}},
		{"deposit", map[string]any{"account_id": "m_1:b", "amount": 5, "currency": "USD"}},
		{"deposit", map[string]any{"account_id": "m_1:a", "amount": 7, "currency": "EUR", "effective_at": eff(2)}},
		{"deposit", map[string]any{"account_id": "m_", "amount": 9, "currency": "USD", "effective_at": eff(2)}},
		{"transfer", map[string]any{"transfer_id": "t2", "from": "m_1", "to": "mX1:a", "amount": 11, "currency": "EUR", "effective_at": eff(2)}},
	}
	var pos string
	for i, s := range steps {
		s.body["idempotency_key"] = fmt.Sprintf("g-%d", i)
		pos = f.env.MustApply(t, s.typ, s.body).Position
	}
	return pos
}

// sumsOf adds up, per currency, the accounts of groupAccounts whose ID starts
// with prefix, each as account(id) gives it (nil: it did not exist): the
// query's expected reply rows, sorted by currency.
func sumsOf(t *testing.T, prefix string, account func(id string) map[string]any) []any {
	t.Helper()
	by := map[string]map[string]any{}
	for _, a := range groupAccounts {
		if !strings.HasPrefix(a.id, prefix) {
			continue
		}
		acc := account(a.id)
		if acc == nil {
			continue
		}
		row := by[a.currency]
		if row == nil {
			row = map[string]any{"currency": a.currency, "balance": 0.0, "held": 0.0, "available": 0.0, "accounts": 0.0}
			by[a.currency] = row
		}
		for _, k := range []string{"balance", "held", "available"} {
			row[k] = row[k].(float64) + acc[k].(float64)
		}
		row["accounts"] = row["accounts"].(float64) + 1
	}
	out := []any{}
	for _, row := range by {
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].(map[string]any)["currency"].(string) < out[j].(map[string]any)["currency"].(string)
	})
	return out
}

// checkGroupSums compares query.balances with the sums of query.account over
// every prefix, and over one currency.
func (f *fixture) checkGroupSums(t *testing.T, what, min string) {
	t.Helper()
	accounts := map[string]map[string]any{}
	for _, a := range groupAccounts {
		accounts[a.id] = f.ask(t, "account", map[string]any{"account_id": a.id, "min_position": min})
	}
	if accounts["m_1:c"]["status"] != "closed" || accounts["m_1:a"]["held"] != 40.0 || accounts["m_1:d:e"]["balance"] != -300.0 {
		t.Fatalf("%s: the group's accounts are not as written: %v", what, accounts)
	}
	for _, p := range groupPrefixes {
		want := sumsOf(t, p, func(id string) map[string]any { return accounts[id] })
		got := f.ask(t, "balances", map[string]any{"prefix": p, "min_position": min})
		if !reflect.DeepEqual(got["balances"], want) || got["prefix"] != p || got["projected_position"] == "" {
			t.Fatalf("%s: balances of %q: %v, want %v", what, p, got, want)
		}
	}
	got := f.ask(t, "balances", map[string]any{"prefix": "m", "currency": "USD"})
	if want := sumsOf(t, "m", func(id string) map[string]any { return onlyUSD(accounts[id]) }); !reflect.DeepEqual(got["balances"], want) {
		t.Fatalf("%s: balances of m in USD: %v, want %v", what, got, want)
	}
}

func onlyUSD(acc map[string]any) map[string]any {
	if acc["currency"] != "USD" {
		return nil
	}
	return acc
}

// checkGroupSumsAsOf compares query.balances as of each event's record time
// and each backdated effective time (and just before each), by at and by
// effective_at, with the sums of query.balance asked the same, over the
// prefixes that group several accounts; of the record times, every one in
// step.
func (f *fixture) checkGroupSumsAsOf(t *testing.T, min string, step int) {
	t.Helper()
	var times []time.Time
	for _, a := range groupAccounts {
		for i, s := range foldAccountStates(t, f, "account-"+a.id) {
			if i%step == 0 {
				times = append(times, s.at)
			}
		}
	}
	for _, ts := range append(times, groupEffective...) {
		for _, by := range []struct{ field, echo string }{{"at", "as_of"}, {"effective_at", "as_of_effective"}} {
			f.checkGroupSumsAt(t, by.field, by.echo, ts, min)
			f.checkGroupSumsAt(t, by.field, by.echo, ts.Add(-time.Microsecond), min)
		}
	}
}

// checkGroupSumsAt compares query.balances with the sums of query.balance,
// both asked with field (at or effective_at) = ts; the reply echoes ts in
// echo.
func (f *fixture) checkGroupSumsAt(t *testing.T, field, echo string, ts time.Time, min string) {
	t.Helper()
	at := ts.Format(time.RFC3339Nano)
	balances := map[string]map[string]any{}
	for _, a := range groupAccounts {
		if b := f.ask(t, "balance", map[string]any{"account_id": a.id, field: at, "min_position": min}); b["code"] == nil {
			balances[a.id] = b
		}
	}
	for _, p := range []string{"m_1:", "m_1", "m"} {
		want := sumsOf(t, p, func(id string) map[string]any { return balances[id] })
		got := f.ask(t, "balances", map[string]any{"prefix": p, field: at, "min_position": min})
		if !reflect.DeepEqual(got["balances"], want) || got[echo] != ts.UTC().Format(time.RFC3339Nano) {
			t.Fatalf("balances of %q, %s %s: %v, want %v", p, field, at, got, want)
		}
	}
}

// checkGroupRefusals asks malformed balances queries: each is invalid_request
// naming its field.
func (f *fixture) checkGroupRefusals(t *testing.T) {
	t.Helper()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for _, bad := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{}, "prefix"},
		{map[string]any{"prefix": "m%"}, "prefix"},
		{map[string]any{"prefix": `m\_`}, "prefix"},
		{map[string]any{"prefix": strings.Repeat("m", 65)}, "prefix"},
		{map[string]any{"prefix": "m", "currency": "eur"}, "currency"},
		{map[string]any{"prefix": "m", "at": "noon"}, "at"},
		{map[string]any{"prefix": "m", "effective_at": "noon"}, "effective_at"},
		{map[string]any{"prefix": "m", "at": now, "effective_at": now}, "effective_at"},
		{map[string]any{"prefix": "m", "min_position": "x"}, "min_position"},
	} {
		r := f.ask(t, "balances", bad.body)
		if r["code"] != "invalid_request" || !reflect.DeepEqual(r["fields"], []any{bad.field}) {
			t.Fatalf("%v: %v, want invalid_request naming %q", bad.body, r, bad.field)
		}
	}
	if code, r, _ := f.get(t, "/v1/balances?prefix="+url.QueryEscape("m%")); code != 400 || r["code"] != "invalid_request" {
		t.Fatalf("GET /v1/balances?prefix=m%%: %d %v", code, r)
	}
	f.checkHTTPParamRefusals(t, url.QueryEscape(now))
}

// checkHTTPParamRefusals: over HTTP, a parameter a query does not take (a
// misspelt effective_at would otherwise answer the current sums) or one given
// twice is 400 invalid_request naming it, on every read route.
func (f *fixture) checkHTTPParamRefusals(t *testing.T, now string) {
	t.Helper()
	for _, bad := range []struct{ path, field string }{
		{"/v1/balances?prefix=m&efective_at=" + now, "efective_at"},
		{"/v1/balances?prefix=m&prefix=n", "prefix"},
		{"/v1/balances?prefix=m&at=" + now + "&at=" + now, "at"},
		{"/v1/accounts/m_1?bogus=1", "bogus"},
		{"/v1/accounts/m_1/balance?effectiveat=" + now, "effectiveat"},
		{"/v1/accounts/m_1/entries?by=effective&frm=" + now, "frm"},
		{"/v1/transfers/t1?status=completed", "status"},
		{"/v1/commands/g-0?min_position=0/0&x=", "x"},
	} {
		code, r, _ := f.get(t, bad.path)
		if code != 400 || r["code"] != "invalid_request" || !reflect.DeepEqual(r["fields"], []any{bad.field}) {
			t.Fatalf("GET %s: %d %v, want 400 invalid_request naming %q", bad.path, code, r, bad.field)
		}
	}
}

// checkPrefixIndexes checks that the generations a rebuild made have the
// prefix indexes of migration 00011 and the balance history's index of 00012.
func (f *fixture) checkPrefixIndexes(t *testing.T, res []projections.RebuildResult) {
	t.Helper()
	tables := map[string]string{projections.Accounts: "accounts", projections.Balances: "balance_history"}
	indexes := map[string][]string{projections.Accounts: {"prefix"}, projections.Balances: {"prefix", "effective"}} // 00011, 00012
	for _, r := range res {
		table, ok := tables[r.Projection]
		if !ok {
			continue
		}
		for _, suffix := range indexes[r.Projection] {
			name := fmt.Sprintf("%s_g%d_%s", table, r.Generation, suffix)
			var n int
			if err := f.env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_indexes WHERE schemaname = 'readmodel' AND indexname = $1`, name).Scan(&n); err != nil || n != 1 {
				t.Fatalf("index %s after the rebuild: %d %v", name, n, err)
			}
		}
		delete(tables, r.Projection)
	}
	if len(tables) > 0 {
		t.Fatalf("the rebuild made no new generation of %v: %+v", tables, res)
	}
}
