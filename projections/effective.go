package projections

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Balances by effective time (PROTOCOL.md §2.3): an account as everything
// effective at or before an instant leaves it, backdated events recorded later
// included. The balance history keeps, per event, the account after it by
// record order and the event's effective time; what an event changed is its
// row less the row before it (by revision), so the account as of an effective
// instant is the sum of those changes over its events effective by then: a
// fold of the events sorted by effective time (the sums do not depend on the
// order). It reads every row of the account (the index of its primary key):
// the cost grows with the account's events, not with the ledger's.

// EffectiveBalance is an account as of an effective instant.
type EffectiveBalance struct {
	AccountID     string
	Currency      string
	Balance, Held int64
	// Revision is the last revision of the events counted (effective by then).
	Revision int64
	Closed   bool
	// Events is how many events are counted.
	Events int64
}

// effectiveBalancesSQL selects EffectiveBalance per account of the rows from
// (the live balance history, or a join that reads some of its rows) that
// where keeps, under the database's collation (the primary key's order).
func effectiveBalancesSQL(from, where string) string {
	return effectiveBalancesFrom("account_id", from, where)
}

// EffectiveBalancesSQL is the query of EffectiveBalance per account over the
// balance history's rows that where keeps (an SQL condition on them, whose
// parameters start at $2; $1 is the instant): its columns are account_id,
// currency, balance, held, revision, closed and events. key is the account's
// key, account_id under the collation the rows are folded in: query.balances
// sums it over a group of accounts, a range of IDs under collation "C", with
// key account_id COLLATE "C", the order of balance_history_g<N>_effective
// (migrations/00012_group_effective_index.sql), which holds every column read:
// a group is then one index-only range scan, without a sort.
func EffectiveBalancesSQL(key, where string) string {
	return effectiveBalancesFrom(key, "readmodel.balance_history", where)
}

// effectiveBalancesFrom is EffectiveBalancesSQL over the rows of from: the
// balance history, or a join that reads the rows of a set of accounts
// (effectiveRows), whose other columns are named apart from the history's.
func effectiveBalancesFrom(key, from, where string) string {
	return fmt.Sprintf(`SELECT account_id, min(currency), coalesce(sum(d_balance), 0)::bigint, coalesce(sum(d_held), 0)::bigint,
	max(revision), bool_or(status = 'closed'), count(*)
FROM (SELECT %[1]s AS account_id, revision, currency, status, effective_at,
		balance - lag(balance, 1, 0::bigint) OVER w AS d_balance,
		held - lag(held, 1, 0::bigint) OVER w AS d_held
	FROM %[3]s WHERE %[2]s
	WINDOW w AS (PARTITION BY %[1]s ORDER BY revision)) d
WHERE effective_at <= $1
GROUP BY account_id ORDER BY account_id`, key, where, from)
}

// EffectiveBalances reads, from the live balance history, every account (or
// the one named by account, when not "") as of the effective instant at, and
// hands each to each in account order (rows are streamed: the caller keeps
// what it needs); every account comes in byte order (everyBalanceSQL). An
// account with no event effective by then is not handed.
func EffectiveBalances(ctx context.Context, q Querier, account string, at time.Time, each func(EffectiveBalance) error) error {
	sql := effectiveBalancesSQL
	if account == "" {
		sql = everyBalanceSQL
	}
	return effectiveBalances(ctx, q, effectiveQuery{sql: sql, table: "readmodel.balance_history", account: account, at: at}, each)
}

// everyBalanceSQL is effectiveBalancesSQL over every account, keyed by
// account_id under collation "C" (byte order; the same accounts, a
// collation of the database's being deterministic): the order of
// balance_history_g<N>_effective, which holds every column read, so the whole
// history is one index-only scan, without a sort. Keyed under the database's
// collation, it was a scan of the primary key fetching every row: twice the
// CPU (invariant 9's sums in an audit, BENCHMARKS.md, auditpg).
func everyBalanceSQL(from, where string) string {
	return effectiveBalancesFrom(`account_id COLLATE "C"`, from, where)
}

// AccountsAfter names accounts and, for each, the revision after which rows
// are read: IDs[i] after Revisions[i] (-1: every row).
type AccountsAfter struct {
	IDs       []string
	Revisions []int64
}

// EffectiveBalancesAfter is EffectiveBalances of the accounts named, over
// each one's rows after its revision (an incremental audit's: the accounts
// its events touched, from their checkpoint's last row), each account one
// range of the primary key, folded in one statement. The balance and held amount are sums of each
// row's change from the row before in what is read (the first row's from
// zero), so over rows after a revision the sums at an instant after them all
// are the last row's, as over every row.
func EffectiveBalancesAfter(ctx context.Context, q Querier, accounts AccountsAfter, at time.Time, each func(EffectiveBalance) error) error {
	return effectiveBalances(ctx, q, effectiveQuery{sql: effectiveBalancesSQL, table: "readmodel.balance_history", after: &accounts, at: at}, each)
}

func effectiveBalances(ctx context.Context, q Querier, eq effectiveQuery, each func(EffectiveBalance) error) error {
	var b EffectiveBalance
	return effectiveRows(ctx, q, eq, []any{&b.AccountID, &b.Currency, &b.Balance, &b.Held, &b.Revision, &b.Closed, &b.Events},
		func() error { return each(b) })
}

// effectiveQuery is a query of the read models by effective time: sql (the
// query over the rows of a source that a filter keeps) over table at the
// instant at, for account ("": every account) or, when after is set, for each
// account it names over its rows after its revision.
type effectiveQuery struct {
	sql     func(from, where string) string
	table   string
	account string
	after   *AccountsAfter
	at      time.Time
}

// effectiveRows runs the query, scanning each row into dest before calling
// each. The accounts of after are read in one statement: each one's rows a
// range of the table's primary key (the lateral subquery, kept apart from the
// join by its OFFSET 0, is an index scan an account: the planner, left to
// join the set, chose a pass over the whole table), folded together.
func effectiveRows(ctx context.Context, q Querier, eq effectiveQuery, dest []any, each func() error) error {
	sql, args := eq.sql(eq.table, "true"), []any{eq.at}
	switch {
	case eq.after != nil:
		from := `unnest($2::text[], $3::bigint[]) AS f(id, rev) CROSS JOIN LATERAL (SELECT * FROM ` + eq.table +
			` r WHERE r.account_id = f.id AND r.revision > f.rev OFFSET 0) r`
		sql = eq.sql(from, "true")
		args = append(args, eq.after.IDs, eq.after.Revisions)
	case eq.account != "":
		sql, args = eq.sql(eq.table, "account_id = $2"), append(args, eq.account)
	}
	rows, err := q.Query(ctx, sql, args...)
	if err == nil {
		_, err = pgx.ForEachRow(rows, dest, each)
	}
	if err != nil {
		return fmt.Errorf("projections: by effective time: %w", err)
	}
	return nil
}

// effectiveEntrySumsSQL selects, per account of the rows of from (the live
// statement, or a join that reads some of its rows), the sum of its entries
// effective at or before $1 that where keeps.
func effectiveEntrySumsSQL(from, where string) string {
	return `SELECT account_id, coalesce(sum(amount), 0)::bigint, count(*) FROM ` + from + `
WHERE ` + where + ` AND effective_at <= $1 GROUP BY account_id ORDER BY account_id`
}

// EffectiveEntrySums reads, from the live statement (the entries read model),
// each account's balance by effective time at the instant at (every account,
// or the one named): the sum of its entries effective by then, from their
// amounts alone (an account's balance is the sum of its entries). It hands
// each to each, in account order, as EffectiveBalances does (Held 0, Revision
// -1, Events the entries counted); an account without such entries is not
// handed.
func EffectiveEntrySums(ctx context.Context, q Querier, account string, at time.Time, each func(EffectiveBalance) error) error {
	return effectiveEntrySums(ctx, q, effectiveQuery{sql: effectiveEntrySumsSQL, table: "readmodel.entries", account: account, at: at}, each)
}

// EffectiveEntrySumsAfter is EffectiveEntrySums of the accounts named, over
// each one's entries after its revision: the sum of those entries alone.
func EffectiveEntrySumsAfter(ctx context.Context, q Querier, accounts AccountsAfter, at time.Time, each func(EffectiveBalance) error) error {
	return effectiveEntrySums(ctx, q, effectiveQuery{sql: effectiveEntrySumsSQL, table: "readmodel.entries", after: &accounts, at: at}, each)
}

func effectiveEntrySums(ctx context.Context, q Querier, eq effectiveQuery, each func(EffectiveBalance) error) error {
	b := EffectiveBalance{Revision: -1}
	return effectiveRows(ctx, q, eq, []any{&b.AccountID, &b.Balance, &b.Events}, func() error { return each(b) })
}

// EndOfTime is an instant after every effective time: the balances as of it
// are the balances by record time (ledger audit checks that they are).
var EndOfTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
