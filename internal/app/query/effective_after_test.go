package query_test

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestEffectiveAfterMatchesThePerAccountQuery: EffectiveBalancesAfter and
// EffectiveEntrySumsAfter (an incremental audit's one statement over the
// accounts it names, each account's rows after its revision through a
// lateral join) equal the per-account query over the rows after that
// revision, over a backdated history: revisions -1, 0, 1, the middle, the
// last two and one past the last, an account with no rows, at every
// effective time of the accounts' rows, 1 µs before each, and the end of time.
func TestEffectiveAfterMatchesThePerAccountQuery(t *testing.T) {
	env := projtest.New(t)
	writeBackdatedHistory(t, env.Ledger, rand.New(rand.NewPCG(20261127, 5)))
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	ctx := context.Background()
	var maxRev int64
	var instants []time.Time
	if err := env.Pool.QueryRow(ctx, `SELECT max(revision), array_agg(DISTINCT effective_at) FROM readmodel.balance_history WHERE account_id IN ('a', 'b')`).Scan(&maxRev, &instants); err != nil {
		t.Fatal(err)
	}
	for _, at := range instants {
		instants = append(instants, at.Add(-time.Microsecond))
	}
	instants = append(instants, projections.EndOfTime)
	ids := []string{"a", "b", "none"}
	compared := 0
	for _, rev := range []int64{-1, 0, 1, maxRev / 2, maxRev - 1, maxRev, maxRev + 1} {
		after := projections.AccountsAfter{IDs: ids, Revisions: []int64{rev, rev, rev}}
		for _, at := range instants {
			for _, c := range afterCases(ctx, env, after, at) {
				compared += checkAfter(t, env, c, rev, at)
			}
		}
	}
	if compared == 0 || maxRev < 10 {
		t.Fatalf("nothing compared (%d accounts handed, last revision %d)", compared, maxRev)
	}
}

// afterCase is an …After function at an instant (run) and the per-account
// query it must equal (ref: $1 the instant, $2 the accounts, $3 the revision).
type afterCase struct {
	name, ref string
	run       func(each func(projections.EffectiveBalance) error) error
}

func afterCases(ctx context.Context, env *projtest.Env, after projections.AccountsAfter, at time.Time) []afterCase {
	return []afterCase{
		{"balances", projections.EffectiveBalancesSQL("account_id", "account_id = ANY($2) AND revision > $3"),
			func(each func(projections.EffectiveBalance) error) error {
				return projections.EffectiveBalancesAfter(ctx, env.Pool, after, at, each)
			}},
		{"entry sums", `SELECT account_id, coalesce(sum(amount), 0)::bigint, count(*) FROM readmodel.entries
				WHERE account_id = ANY($2) AND revision > $3 AND effective_at <= $1 GROUP BY account_id ORDER BY account_id`,
			func(each func(projections.EffectiveBalance) error) error {
				return projections.EffectiveEntrySumsAfter(ctx, env.Pool, after, at, each)
			}},
	}
}

// checkAfter compares what c's …After function hands with the rows of its
// per-account query; it returns how many accounts it handed.
func checkAfter(t *testing.T, env *projtest.Env, c afterCase, rev int64, at time.Time) int {
	t.Helper()
	var got, want []projections.EffectiveBalance
	if err := c.run(func(b projections.EffectiveBalance) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	rows, err := env.Pool.Query(context.Background(), c.ref, at, []string{"a", "b", "none"}, rev)
	if err != nil {
		t.Fatal(err)
	}
	b := projections.EffectiveBalance{Revision: -1}
	dest := []any{&b.AccountID, &b.Balance, &b.Events}
	if c.name == "balances" {
		dest = []any{&b.AccountID, &b.Currency, &b.Balance, &b.Held, &b.Revision, &b.Closed, &b.Events}
	}
	if _, err := pgx.ForEachRow(rows, dest, func() error { want = append(want, b); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s after revision %d at %s:\n got %+v\nwant %+v", c.name, rev, at.Format(time.RFC3339Nano), got, want)
	}
	return len(got)
}
