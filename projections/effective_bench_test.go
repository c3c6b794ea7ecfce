package projections

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkEffectiveBalancesAfter: what an incremental audit's balances by
// effective time cost (EffectiveBalancesAfter: the accounts touched, each
// over its rows after a revision, folded in one statement) at
// LEDGER_BENCH_ACCOUNTS accounts (default 100,000) of LEDGER_BENCH_ROWS
// balance-history rows each (default 10), one account in 40 touched and read
// over its last 3 rows, against the query it replaces, measured in the same
// run: the whole query by effective time once per account, in a lateral
// subquery ("lateral"); and a plain join of the set with the history
// ("join"), the plan left to PostgreSQL (the one-statement form without
// effectiveRows' OFFSET 0). All must hand the same balances.
//
//	LEDGER_BENCH_ACCOUNTS=100000 go test ./projections -run '^$' -bench EffectiveBalancesAfter -benchtime 3x
func BenchmarkEffectiveBalancesAfter(b *testing.B) {
	ctx := context.Background()
	pool, n := devtest.BenchAccounts(b)
	rows := max(devtest.BenchEnv("LEDGER_BENCH_ROWS", 10), 4) // the last 3 read
	if _, err := pool.Exec(ctx, `INSERT INTO readmodel.balance_history (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
		SELECT 'acct-' || i, r, gen_random_uuid(), 'Credited', 'EUR', i * r, r, 'open', now(), now() - (r || ' s')::interval
		FROM generate_series(1, $1) i, generate_series(1, $2) r`, n, rows); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	var after AccountsAfter
	for i := 1; i <= n; i += 40 {
		after.IDs, after.Revisions = append(after.IDs, fmt.Sprintf("acct-%d", i)), append(after.Revisions, int64(rows-3))
	}
	lateral := func(from, where string) string {
		return `SELECT e.* FROM unnest($2::text[], $3::bigint[]) AS f(id, rev) CROSS JOIN LATERAL (` +
			EffectiveBalancesSQL("account_id", "account_id = f.id AND revision > f.rev") + `) e ORDER BY 1`
	}
	join := func(from, where string) string {
		return effectiveBalancesSQL(`unnest($2::text[], $3::bigint[]) AS f(id, rev) JOIN readmodel.balance_history r ON r.account_id = f.id AND r.revision > f.rev`, "true")
	}
	got := map[string][]EffectiveBalance{}
	devtest.TimeStatements(b, "lateral", []string{"lateral", "set", "join"}, func(name string) error {
		eq := effectiveQuery{sql: effectiveBalancesSQL, table: "readmodel.balance_history", after: &after, at: EndOfTime}
		if name == "lateral" {
			eq.sql = lateral
		}
		if name == "join" {
			eq.sql = join
		}
		var out []EffectiveBalance
		err := effectiveBalances(ctx, pool, eq, func(e EffectiveBalance) error { out = append(out, e); return nil })
		got[name] = out
		return err
	})
	if len(got["set"]) != len(after.IDs) || !reflect.DeepEqual(got["set"], got["lateral"]) || !reflect.DeepEqual(got["set"], got["join"]) {
		b.Fatalf("the set statement handed %d balances, the lateral one %d, the join %d, or others", len(got["set"]), len(got["lateral"]), len(got["join"]))
	}
}
