package query_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// Group-balance sizes of BenchmarkGroupBalances: a large group, a small one
// (the same-run baseline), and accounts of neither, in one read model.
const (
	benchLarge    = 100_000 // merchants:<i>:payable
	benchSmall    = 1_000   // partners:<i>
	benchOthers   = 100_000 // customers:<i>
	benchHistory  = 5       // balance-history rows per account
	benchAccounts = benchLarge + benchSmall + benchOthers
)

// benchBase is when the seeded history starts; account i's event r is at
// benchBase + r hours + i milliseconds.
var benchBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// BenchmarkGroupBalances measures ledger.v1.query.balances over 100,000
// accounts under one prefix, now, as of a time and by effective time (each
// seeded event effective when recorded), against the same queries over a
// 1,000-account prefix, and against asking query.account for each of the
// 1,000 (a client adding up the group itself, in process: no NATS), and
// the large group's SQL as of a time with PostgreSQL's JIT on and off, all in
// each iteration, so that every ratio is of one run. The read models are
// seeded directly (benchAccounts accounts, benchHistory history rows each),
// vacuumed and analysed, as autovacuum leaves a table at rest. With -v it
// logs EXPLAIN (ANALYZE, BUFFERS) of the large group's three queries and of
// the small group's current sums.
//
//	go test -run '^$' -bench GroupBalances -benchtime 5x -v ./internal/app/query/
func BenchmarkGroupBalances(b *testing.B) {
	env := projtest.New(b)
	seedGroups(b, env.Pool)
	svc := query.New(env.Pool, query.Options{})
	ctx := context.Background()
	at := benchBase.Add(2*time.Hour + 30*time.Minute).Format(time.RFC3339Nano) // mid-history: row 2 of each account
	from, to := "merchants:", query.PrefixEnd("merchants:")                    // the large group's range
	cases := []struct {
		name string
		run  func() error
	}{
		{"now-100k", sumsRun(ctx, svc, "merchants:", "", benchLarge, benchHistory-1)},
		{"now-1k", sumsRun(ctx, svc, "partners:", "", benchSmall, benchHistory-1)},
		{"at-100k", sumsRun(ctx, svc, "merchants:", at, benchLarge, 2)},
		{"at-1k", sumsRun(ctx, svc, "partners:", at, benchSmall, 2)},
		{"effective-100k", sumsRun(ctx, svc, "merchants:", "effective:"+at, benchLarge, 2)},
		{"effective-1k", sumsRun(ctx, svc, "partners:", "effective:"+at, benchSmall, 2)},
		{"account-by-account-1k", func() error { return addUpAccounts(ctx, svc) }},
		{"sql-at-100k-jit-off", sqlRun(ctx, env.Pool, "off", query.SumsAsOfSQL, from, to, "", at)},
		{"sql-at-100k-jit-on", sqlRun(ctx, env.Pool, "on", query.SumsAsOfSQL, from, to, "", at)},
		{"sql-effective-100k", sqlRun(ctx, env.Pool, "off", query.SumsEffectiveSQL, at, from, to, "")},
		{"sql-effective-100k-lateral", sqlRun(ctx, env.Pool, "off", lateralEffectiveSQL, at, from, to, "")},
	}
	spent := make([]time.Duration, len(cases))
	b.ResetTimer()
	for range b.N {
		for i, c := range cases {
			start := time.Now()
			if err := c.run(); err != nil {
				b.Fatalf("%s: %v", c.name, err)
			}
			spent[i] += time.Since(start)
		}
	}
	b.StopTimer()
	ms := func(i int) float64 { return float64(spent[i].Microseconds()) / 1e3 / float64(b.N) }
	for i, c := range cases {
		b.ReportMetric(ms(i), "ms/"+c.name)
	}
	b.ReportMetric(ms(0)/ms(1), "x-now-100k/1k")
	b.ReportMetric(ms(2)/ms(3), "x-at-100k/1k")
	b.ReportMetric(ms(4)/ms(5), "x-effective-100k/1k")
	b.ReportMetric(ms(6)/ms(1), "x-accounts/balances-1k")
	b.ReportMetric(ms(8)/ms(7), "x-jit-on/off")
	b.ReportMetric(ms(10)/ms(9), "x-effective-lateral/range")
	explainSums(b, env.Pool, at)
}

// sumsRun asks the balances query over prefix (as of at unless "", by
// effective time when at is "effective:<time>") and checks its one EUR row:
// accounts n, each with the balance of its history row r.
func sumsRun(ctx context.Context, svc *query.Service, prefix, at string, n, r int) func() error {
	want := int64(n) * int64(r) * 100
	req := query.BalancesRequest{Prefix: prefix, At: at}
	if eff, ok := strings.CutPrefix(at, "effective:"); ok {
		req.At, req.EffectiveAt = "", eff
	}
	return func() error {
		out, qerr := svc.Balances(ctx, req)
		if qerr != nil {
			return qerr
		}
		if len(out.Balances) != 1 || out.Balances[0].Accounts != int64(n) || out.Balances[0].Balance != want {
			return fmt.Errorf("%+v, want %d accounts and %d", out.Balances, n, want)
		}
		return nil
	}
}

// sqlRun runs one of the large group's sums queries straight in SQL (sql,
// its args), with PostgreSQL's JIT set to jit (the query turns it off: the
// as-of pair measures why), and checks that it summed every account of the
// group.
func sqlRun(ctx context.Context, pool *pgxpool.Pool, jit, sql string, args ...any) func() error {
	return func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL jit = `+jit); err != nil {
				return err
			}
			var currency, balance, held, available string
			var n int64
			err := tx.QueryRow(ctx, sql, args...).Scan(&currency, &balance, &held, &available, &n)
			if err == nil && n != benchLarge {
				err = fmt.Errorf("%d accounts, want %d", n, benchLarge)
			}
			return err
		})
	}
}

// lateralEffectiveSQL is the balances query by effective time as it was
// before migration 00012: each account of the range (its opening row, through
// balance_history_g<N>_prefix) folded in a lateral subquery of its own,
// through the primary key. It is effective-100k's baseline in the same run.
var lateralEffectiveSQL = `SELECT h.currency, sum(h.balance)::text, sum(h.held)::text, (sum(h.balance) - sum(h.held))::text, count(*)
	FROM readmodel.balance_history o
	CROSS JOIN LATERAL (` + projections.EffectiveBalancesSQL("account_id", `account_id = o.account_id`) + `)
		AS h (account_id, currency, balance, held, revision, closed, events)
	WHERE o.revision = 0 AND o.account_id COLLATE "C" >= $2 AND o.account_id COLLATE "C" < $3 AND ($4 = '' OR o.currency = $4)
	GROUP BY h.currency ORDER BY h.currency`

// addUpAccounts asks query.account for each account of the small group and
// adds up the balances, as a client without query.balances would.
func addUpAccounts(ctx context.Context, svc *query.Service) error {
	var sum int64
	for i := range benchSmall {
		a, qerr := svc.Account(ctx, query.AccountRequest{AccountID: fmt.Sprintf("partners:%d", i)})
		if qerr != nil {
			return qerr
		}
		sum += a.Balance
	}
	if want := int64(benchSmall) * (benchHistory - 1) * 100; sum != want {
		return fmt.Errorf("sum %d, want %d", sum, want)
	}
	return nil
}

// seedGroups writes the accounts and their balance history straight into the
// live generations (through the views), then vacuums and analyses them.
func seedGroups(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	groups := `(SELECT 'merchants:' || i || ':payable' AS id, i FROM generate_series(0, $1 - 1) i
		UNION ALL SELECT 'partners:' || i, i FROM generate_series(0, $2 - 1) i
		UNION ALL SELECT 'customers:' || i, i FROM generate_series(0, $3 - 1) i)`
	for _, sql := range []string{
		`INSERT INTO readmodel.accounts (account_id, currency, overdraft_limit, status, balance, held, revision, opened_at, updated_at)
			SELECT id, 'EUR', 0, 'open', ($4 - 1) * 100, 0, $4 - 1, $5, $5 FROM ` + groups + ` g`,
		`INSERT INTO readmodel.balance_history (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
			SELECT id, r, gen_random_uuid(), CASE WHEN r = 0 THEN 'AccountOpened' ELSE 'Credited' END, 'EUR', r * 100, 0, 'open', t, t
			FROM ` + groups + ` g, generate_series(0, $4 - 1) r,
				LATERAL (SELECT $5::timestamptz + make_interval(hours => r) + make_interval(secs => i / 1000.0) AS t) tt`,
	} {
		if _, err := pool.Exec(ctx, sql, benchLarge, benchSmall, benchOthers, benchHistory, benchBase); err != nil {
			b.Fatal(err)
		}
	}
	for _, t := range []string{"accounts", "balance_history"} {
		var table string
		if err := pool.QueryRow(ctx, `SELECT c.relname FROM pg_rewrite r JOIN pg_depend d ON d.objid = r.oid JOIN pg_class c ON c.oid = d.refobjid
			WHERE r.ev_class = ('readmodel.' || $1)::regclass AND c.relkind = 'r' LIMIT 1`, t).Scan(&table); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE readmodel.`+table); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d accounts, %d history rows in %s", benchAccounts, benchAccounts*benchHistory, time.Since(start).Round(time.Millisecond))
}

// explainSums logs the plans of the queries as they run (JIT off, as
// query.Service.Balances sets it).
func explainSums(b *testing.B, pool *pgxpool.Pool, at string) {
	b.Helper()
	ctx := context.Background()
	from, to := "merchants:", query.PrefixEnd("merchants:")
	for _, q := range []struct {
		name string
		sql  string
		args []any
	}{
		{"now, 100,000 accounts", query.CurrentSumsSQL, []any{from, to, ""}},
		{"at, 100,000 accounts", query.SumsAsOfSQL, []any{from, to, "", at}},
		{"now, 1,000 accounts", query.CurrentSumsSQL, []any{"partners:", query.PrefixEnd("partners:"), ""}},
		{"effective, 100,000 accounts", query.SumsEffectiveSQL, []any{at, from, to, ""}},
	} {
		var plan []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+q.sql, q.args...)
			if err != nil {
				return err
			}
			var line string
			_, err = pgx.ForEachRow(rows, []any{&line}, func() error { plan = append(plan, line); return nil })
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("EXPLAIN %s:\n%s", q.name, strings.Join(plan, "\n"))
	}
}
