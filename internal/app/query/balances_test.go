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
// and after a rebuild; as of each event's time they equal the sums of
// query.balance at that time; over HTTP they are the same; bad requests are
// invalid_request naming the field.
func TestGroupBalancesEqualTheSumOfAccounts(t *testing.T) {
	f := setup(t, 10*time.Second)
	last := writeGroup(t, f)
	f.start(t)

	f.checkGroupSums(t, "live", last)
	f.checkGroupSumsAsOf(t, last)
	code, h, _ := f.get(t, "/v1/balances?prefix="+url.QueryEscape("m_1:")+"&currency=EUR")
	if want := f.ask(t, "balances", map[string]any{"prefix": "m_1:", "currency": "EUR"}); code != 200 || !reflect.DeepEqual(h, want) {
		t.Fatalf("GET /v1/balances: %d %v, want %v", code, h, want)
	}
	f.checkGroupRefusals(t)

	res, err := projections.Rebuild(context.Background(), f.env.Pool, f.env.Store, projections.RebuildOptions{Verify: audit.VerifyGeneration(f.env.Pool, f.env.Store)})
	if err != nil {
		t.Fatal(err)
	}
	f.checkPrefixIndexes(t, res)
	f.checkGroupSums(t, "after a rebuild", last)
	f.checkGroupSumsAsOf(t, last)
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

// writeGroup opens groupAccounts and moves money among them: deposits, a
// hold, a transfer out of the group, an overdraft, and an account emptied and
// closed. It returns the last write's position.
func writeGroup(t *testing.T, f *fixture) string {
	t.Helper()
	for i, a := range groupAccounts {
		f.env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-" + a.id, "account_id": a.id, "currency": a.currency, "overdraft_limit": 500})
		f.env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-" + a.id, "account_id": a.id, "amount": 100 * (i + 1), "currency": a.currency})
	}
	steps := []struct {
		typ  string
		body map[string]any
	}{
		{"place_hold", map[string]any{"account_id": "m_1:a", "hold_id": "h1", "amount": 40, "currency": "EUR"}},
		{"transfer", map[string]any{"transfer_id": "t1", "from": "m_1:a", "to": "mX1:a", "amount": 30, "currency": "EUR"}},
		{"withdraw", map[string]any{"account_id": "m_1:d:e", "amount": 700, "currency": "EUR"}},
		{"withdraw", map[string]any{"account_id": "m_1:c", "amount": 300, "currency": "EUR"}},
		{"close_account", map[string]any{"account_id": "m_1:c"}},
		{"deposit", map[string]any{"account_id": "m_1:b", "amount": 5, "currency": "USD"}},
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

// checkGroupSumsAsOf compares query.balances as of each event's time (and
// just before it) with the sums of query.balance at that time, over the
// prefixes that group several accounts.
func (f *fixture) checkGroupSumsAsOf(t *testing.T, min string) {
	t.Helper()
	var times []time.Time
	for _, a := range groupAccounts {
		for _, s := range foldAccountStates(t, f, "account-"+a.id) {
			times = append(times, s.at, s.at.Add(-time.Microsecond))
		}
	}
	for i, ts := range times {
		at := ts.Format(time.RFC3339Nano)
		balances := map[string]map[string]any{}
		for _, a := range groupAccounts {
			if b := f.ask(t, "balance", map[string]any{"account_id": a.id, "at": at, "min_position": min}); b["code"] == nil {
				balances[a.id] = b
			}
		}
		for _, p := range []string{"m_1:", "m_1", "m"} {
			want := sumsOf(t, p, func(id string) map[string]any { return balances[id] })
			got := f.ask(t, "balances", map[string]any{"prefix": p, "at": at, "min_position": min})
			if !reflect.DeepEqual(got["balances"], want) || got["as_of"] != ts.UTC().Format(time.RFC3339Nano) {
				t.Fatalf("balances of %q as of %s (time %d): %v, want %v", p, at, i, got, want)
			}
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
}

// checkPrefixIndexes checks that the generations a rebuild made have the
// prefix indexes of migration 00011.
func (f *fixture) checkPrefixIndexes(t *testing.T, res []projections.RebuildResult) {
	t.Helper()
	tables := map[string]string{projections.Accounts: "accounts", projections.Balances: "balance_history"}
	for _, r := range res {
		table, ok := tables[r.Projection]
		if !ok {
			continue
		}
		name := fmt.Sprintf("%s_g%d_prefix", table, r.Generation)
		var n int
		if err := f.env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_indexes WHERE schemaname = 'readmodel' AND indexname = $1`, name).Scan(&n); err != nil || n != 1 {
			t.Fatalf("index %s after the rebuild: %d %v", name, n, err)
		}
		delete(tables, r.Projection)
	}
	if len(tables) > 0 {
		t.Fatalf("the rebuild made no new generation of %v: %+v", tables, res)
	}
}
