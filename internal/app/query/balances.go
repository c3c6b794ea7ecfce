package query

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/projections"
)

// BalancesRequest is the body of ledger.v1.query.balances (v1.2): the sums
// over every account whose ID starts with Prefix, now or as of At (RFC 3339,
// the record time) or EffectiveAt (§2.3), optionally of one Currency.
type BalancesRequest struct {
	Prefix      string `json:"prefix"`
	Currency    string `json:"currency,omitempty"`
	At          string `json:"at,omitempty"`
	EffectiveAt string `json:"effective_at,omitempty"`
	MinPosition string `json:"min_position,omitempty"`
}

// The answers of the balances query are reply's, as the other queries' are.
type (
	Balances        = reply.Balances
	CurrencyBalance = reply.CurrencyBalance
)

// group is what a balances query asks: the account IDs in [from, to) under
// collation "C" (the IDs that start with the prefix), of one currency or all
// (""), now, as of at, or with everything effective by effective.
type group struct {
	from, to      string
	currency      string
	at, effective *time.Time
}

// sumsRead is how a group's sums are read: the read model that answers them,
// and the SQL that sums them (sumCols) with its arguments.
type sumsRead struct {
	projection, sql string
	args            []any
}

// read is how g's sums are read.
func (g group) read() sumsRead {
	switch {
	case g.at != nil:
		return sumsRead{projections.Balances, sumsAsOf, []any{g.from, g.to, g.currency, *g.at}}
	case g.effective != nil:
		return sumsRead{projections.Balances, sumsEffective, []any{*g.effective, g.from, g.to, g.currency}}
	}
	return sumsRead{projections.Accounts, currentSums, []any{g.from, g.to, g.currency}}
}

// groupOf checks a balances query and returns the group it asks about.
func groupOf(q BalancesRequest) (group, *reply.QueryError) {
	if !domain.ValidID(q.Prefix) {
		return group{}, invalidID("prefix")
	}
	if q.Currency != "" && !domain.ValidCurrency(q.Currency) {
		return group{}, invalid("currency", "must be three upper-case letters (ISO 4217 style)")
	}
	at, qerr := timeBound("at", q.At)
	if qerr != nil {
		return group{}, qerr
	}
	eff, qerr := timeBound("effective_at", q.EffectiveAt)
	switch {
	case qerr != nil:
		return group{}, qerr
	case eff != nil && at != nil:
		return group{}, invalid("effective_at", "give at or effective_at, not both")
	}
	return group{from: q.Prefix, to: prefixEnd(q.Prefix), currency: q.Currency, at: at, effective: eff}, nil
}

// prefixEnd is the least string above every string that starts with prefix,
// in byte order: prefix with its last byte incremented. A valid ID is ASCII
// below 0x7f, so the increment never carries.
func prefixEnd(prefix string) string {
	return prefix[:len(prefix)-1] + string(rune(prefix[len(prefix)-1]+1))
}

// Balances answers the balances query: the current sums from the accounts read
// model, or the sums as of a time or an effective instant from the balance
// history, each read in one snapshot with its projection's checkpoint. A prefix is a range of IDs under
// collation "C" (migrations/00011_group_balance_indexes.sql), so '_', '.' and
// the like match themselves only. A sum beyond the int64 range is
// amount_overflow.
func (s *Service) Balances(ctx context.Context, q BalancesRequest) (*Balances, *reply.QueryError) {
	g, qerr := groupOf(q)
	if qerr != nil {
		return nil, qerr
	}
	r := g.read()
	if _, qerr := s.wait(ctx, r.projection, q.MinPosition); qerr != nil {
		return nil, qerr
	}
	out := &Balances{Prefix: q.Prefix, Balances: []CurrencyBalance{}}
	out.AsOf, out.AsOfEffective = echoTime(g.at, ""), echoTime(g.effective, "")
	var pos eventstore.Position
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// A large group's plan costs enough for PostgreSQL to compile it (JIT),
		// and its work is index lookups, which compiling does not speed up: by
		// effective time over 100,000 accounts, 4.3 s of 11.9 s went to
		// compiling (BENCHMARKS.md, group balances).
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		var err error
		if pos, err = projections.Checkpoints.LiveOf(ctx, tx, r.projection); err != nil {
			return err
		}
		out.Balances, err = readSums(ctx, tx, r.sql, r.args)
		return err
	})
	out.ProjectedPosition = pos.String()
	var oe *overflowError
	if errors.As(err, &oe) {
		return nil, &reply.QueryError{Status: domain.StatusRejected, Code: domain.CodeAmountOverflow, ProjectedPosition: out.ProjectedPosition,
			Message: fmt.Sprintf("the %s of %s over prefix %q leaves the int64 range: ask a narrower prefix", oe.what, oe.currency, q.Prefix)}
	}
	if err != nil {
		return nil, internal(err)
	}
	return out, nil
}

// The sums of a group, one row per currency, over rows aliased h: $1 and $2
// the range of IDs, $3 the currency ("": all). Sums are numeric, carried as
// text so that one beyond int64 is seen (overflowError) rather than wrapped.
const sumCols = `h.currency, sum(h.balance)::text, sum(h.held)::text, (sum(h.balance) - sum(h.held))::text, count(*)`

var (
	// currentSums reads the accounts read model through accounts_g<N>_prefix.
	currentSums = `SELECT ` + sumCols + ` FROM readmodel.accounts h
		WHERE h.account_id COLLATE "C" >= $1 AND h.account_id COLLATE "C" < $2 AND ($3 = '' OR h.currency = $3)
		GROUP BY h.currency ORDER BY h.currency`
	// sumsEffective folds the history of every account of the range with
	// everything effective by $1 (projections.EffectiveBalancesSQL, the rule
	// of query.balance: its events' changes, held included), in one range
	// scan of balance_history_g<N>_effective; an account with no event
	// effective by then is not summed. $2 and $3 are the range, $4 the
	// currency.
	sumsEffective = `SELECT ` + sumCols + ` FROM (` + projections.EffectiveBalancesSQL(`account_id COLLATE "C"`,
		`account_id COLLATE "C" >= $2 AND account_id COLLATE "C" < $3 AND ($4 = '' OR currency = $4)`) + `)
			AS h (account_id, currency, balance, held, revision, closed, events)
		GROUP BY h.currency ORDER BY h.currency`
	// sumsAsOf takes the accounts of the range from balance_history_g<N>_prefix
	// (their opening rows) and each one's row as of $4 (historyAsOf); an account
	// with no event by then is not summed.
	sumsAsOf = `SELECT ` + sumCols + ` FROM readmodel.balance_history o
		CROSS JOIN LATERAL (SELECT currency, balance, held ` + historyAsOf("o.account_id", "$4") + `) h
		WHERE o.revision = 0 AND o.account_id COLLATE "C" >= $1 AND o.account_id COLLATE "C" < $2 AND ($3 = '' OR o.currency = $3)
		GROUP BY h.currency ORDER BY h.currency`
)

// historyAsOf is the rule "an account as of a time" over the balance history,
// for the balance and the balances query: its last row at or before the time,
// the later revision on a tie. account and at are SQL expressions.
func historyAsOf(account, at string) string {
	return `FROM readmodel.balance_history WHERE account_id = ` + account + ` AND at <= ` + at +
		` ORDER BY at DESC, revision DESC LIMIT 1`
}

// readSums runs one of the sums queries.
func readSums(ctx context.Context, tx pgx.Tx, sql string, args []any) ([]CurrencyBalance, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out := []CurrencyBalance{}
	var (
		r                    CurrencyBalance
		balance, held, avail string
	)
	_, err = pgx.ForEachRow(rows, []any{&r.Currency, &balance, &held, &avail, &r.Accounts}, func() error {
		for _, f := range []struct {
			what string
			text string
			dst  *int64
		}{{"balance", balance, &r.Balance}, {"held", held, &r.Held}, {"available", avail, &r.Available}} {
			n, err := strconv.ParseInt(f.text, 10, 64)
			if err != nil {
				return &overflowError{what: f.what, currency: r.Currency}
			}
			*f.dst = n
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// overflowError is a sum beyond the int64 range.
type overflowError struct{ what, currency string }

func (e *overflowError) Error() string {
	return "the sum of " + e.what + " in " + e.currency + " leaves int64"
}
