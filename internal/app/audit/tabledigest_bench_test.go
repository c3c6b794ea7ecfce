package audit

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
)

// BenchmarkAccountsTableDigest: what the incremental audit's whole-table
// checks cost at LEDGER_BENCH_ACCOUNTS accounts (default 100,000; one
// balance-history row and one entry each, 1% of them touched): the accounts
// table's digest (checkAccountsTable's statement in one, and in the two
// an incremental audit makes: the whole beside the fold, the touched rows
// after it, untouched.go) and invariant 9 of the untouched accounts
// (untouchedBroken's, balance history and statement), and the holds
// table's digest (checkHoldsTable's statements likewise,
// LEDGER_BENCH_HOLDS holds per account, default 4: one active, the others
// closed, as the table keeps them; one of each touched account's touched),
// each against a baseline in the same run, a count of the accounts table
// (one pass over it, nothing hashed). LEDGER_BENCH_TOUCH_EVERY=k touches
// one account in k (default 100: 1%).
//
//	LEDGER_BENCH_ACCOUNTS=1000000 LEDGER_BENCH_HOLDS=4 go test ./internal/app/audit -run '^$' -bench AccountsTableDigest -benchtime 3x
func BenchmarkAccountsTableDigest(b *testing.B) {
	ctx := context.Background()
	pool, n := devtest.BenchAccounts(b)
	holds := devtest.BenchEnv("LEDGER_BENCH_HOLDS", 4)
	for _, sql := range []string{
		`INSERT INTO readmodel.accounts (account_id, currency, overdraft_limit, metadata, status, balance, held, revision, opened_at, updated_at)
			SELECT 'acct-' || i, 'EUR', 0, '{"k": "v"}', 'open', i, 0, 1, now(), now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.balance_history (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
			SELECT 'acct-' || i, 1, gen_random_uuid(), 'Deposited', 'EUR', i, 0, 'open', now(), now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.entries (event_id, account_id, revision, type, reason, ref, amount, currency, balance_after, idempotency_key, at, metadata, effective_at)
			SELECT gen_random_uuid(), 'acct-' || i, 1, 'Deposited', 'deposit', '', i, 'EUR', i, 'k-' || i, now(), '{}', now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.holds (account_id, hold_id, amount, currency, status, captured, expires_at, idempotency_key, revision, placed_at, updated_at)
			SELECT 'acct-' || i, 'hold-' || j, 100, 'EUR', CASE WHEN j = 1 THEN 'active' ELSE 'captured' END, CASE WHEN j = 1 THEN 0 ELSE 100 END,
				now() + interval '1 day', 'h-' || i || '-' || j, j, now(), now()
			FROM generate_series(1, $1) i, generate_series(1, ` + strconv.Itoa(holds) + `) j`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, sql, n); err != nil && sql != `ANALYZE` {
			b.Fatal(err)
		}
	}
	var (
		touched, touchedHolds []string
		rows                  []accountCols
	)
	for i := 1; i <= n; i += devtest.BenchEnv("LEDGER_BENCH_TOUCH_EVERY", 100) {
		touched, touchedHolds = append(touched, fmt.Sprintf("acct-%d", i)), append(touchedHolds, fmt.Sprintf("acct-%d/hold-1", i))
		rows = append(rows, accountCols{id: touched[len(touched)-1], currency: "EUR", metadata: `{"k":"v"}`, status: "open", balance: int64(i), available: int64(i), rev: 1})
	}
	old := accountColumns.arrays(rows)
	statements := map[string]func(pgx.Tx) error{
		"count": func(tx pgx.Tx) error {
			var c int64
			return tx.QueryRow(ctx, `SELECT count(*) FROM `+projections.View("accounts")).Scan(&c)
		},
		"digest": func(tx pgx.Tx) error {
			_, err := sumTable(ctx, tx, "accounts", accountsSQLs, tableSum{touched: touched, lookup: []any{touched}, old: old})
			return err
		},
		"digest-whole": func(tx pgx.Tx) error {
			_, err := wholeDigest("accounts", accountsSQLs)(ctx, tx)
			return err
		},
		"digest-touched": func(tx pgx.Tx) error {
			_, err := sumTable(ctx, tx, "accounts", accountsSQLs, tableSum{touched: touched, lookup: []any{touched}, old: old, whole: "0"})
			return err
		},
		"holds": func(tx pgx.Tx) error {
			_, err := sumTable(ctx, tx, "holds", holdsSQLs, tableSum{touched: touchedHolds, lookup: holdLookup(touchedHolds), old: holdColumns.arrays(nil)})
			return err
		},
		"holds-touched": func(tx pgx.Tx) error {
			_, err := sumTable(ctx, tx, "holds", holdsSQLs, tableSum{touched: touchedHolds, lookup: holdLookup(touchedHolds), old: holdColumns.arrays(nil), whole: "0"})
			return err
		},
		"history": func(tx pgx.Tx) error {
			return untouchedNone(untouchedBroken(ctx, tx, liveGen{name: projections.Balances}))
		},
		"entries": func(tx pgx.Tx) error {
			return untouchedNone(untouchedBroken(ctx, tx, liveGen{name: projections.Entries}))
		},
	}
	devtest.TimeStatements(b, "count", []string{"count", "digest", "digest-whole", "digest-touched", "holds", "holds-touched", "history", "entries"}, func(name string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return statements[name](tx) })
	})
}

// untouchedNone fails on an account found broken: the benchmark's tables
// break no rule.
func untouchedNone(found []effectiveFound, err error) error {
	if err == nil && len(found) > 0 {
		err = fmt.Errorf("%d untouched accounts found broken, the first %+v", len(found), found[0])
	}
	return err
}
