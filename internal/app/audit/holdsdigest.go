package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/projections"
)

// The accounts read model's second table, holds, is compared whole as the
// accounts table is (tabledigest.go): an incremental audit compares the rows
// of the holds its events touched one by one (the rows the fold noted), and
// the others as the sum of a 64-bit hash of each row (holdRowHash), which
// must equal the checkpoint's digest of the table (AuditCheckpoint.HoldsTable,
// migration 00016) less the touched holds' rows as the checkpoint's accounts
// held them (resumedAccounts.oldHolds). A hold is keyed account/hold, not by
// account: a touched account's holds that no event after the checkpoint
// touched are compared through the digest too. The checkpoint's snapshots
// keep every active hold (a closed one may be forgotten, but no event
// touches a closed hold again).

// holdRowHash hashes a holds row's compared columns (those openTable reads)
// to a 64-bit integer, its expiry as microseconds since the epoch: a
// timestamptz's text depends on the session's time zone.
const holdRowHash = `('x' || substr(md5(ROW(account_id, hold_id, amount, currency, status, captured,
	(extract(epoch FROM expires_at) * 1000000)::bigint, idempotency_key)::text), 1, 16))::bit(64)::bigint`

// holdsTableDigestSQL sums, in the read models' snapshot, the hashes of the
// holds table's rows (%s: the live view) apart from the holds $1 (keys
// account/hold: the whole table's, the others'), and of the rows $2..$9 (the
// touched holds' checkpoint rows), each sum a decimal integer.
const holdsTableDigestSQL = `SELECT coalesce(sum(h), 0)::text, coalesce(sum(h) FILTER (WHERE t.k IS NULL), 0)::text,
	(SELECT coalesce(sum(` + holdRowHash + `), 0)
		FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[], $9::text[])
		AS o(account_id, hold_id, amount, currency, status, captured, expires_at, idempotency_key))::text
FROM (SELECT account_id, hold_id, ` + holdRowHash + ` AS h FROM %s) a LEFT JOIN unnest($1::text[]) t(k) ON t.k = a.account_id || '/' || a.hold_id`

// holdCols are a holds row's compared columns, as the fold expects them
// (holdRowOf renders them).
type holdCols struct {
	account, id, currency, status, key string
	amount, captured                   int64
	expires                            *time.Time
}

func holdColsOf(account, currency string, h *domain.Hold, captured int64) holdCols {
	var exp *time.Time
	if !h.ExpiresAt.IsZero() {
		t := h.ExpiresAt
		exp = &t
	}
	return holdCols{account: account, id: h.ID, currency: currency, status: string(h.Status), key: h.Key,
		amount: h.Amount, captured: captured, expires: exp}
}

// noteOldHolds keeps the holds of account a, read from the checkpoint, as
// the holds table held them then (a hold captured by then captured its
// amount; none is touched again).
func (r *resumedAccounts) noteOldHolds(a *domain.Account) {
	for _, h := range a.Holds {
		var captured int64
		if h.Status == domain.HoldStatusCaptured {
			captured = h.Amount
		}
		r.oldHolds[a.ID+"/"+h.ID] = holdColsOf(a.ID, a.Currency, h, captured)
	}
}

// checkHoldsTable sums the holds table of the accounts read model l in the
// snapshot tx and, in an incremental audit, compares the rows of the holds
// its events did not touch (up to seq, l's checkpoint) with the checkpoint's
// digest less the touched holds' checkpoint rows. It returns the whole
// table's digest.
func (f *Fold) checkHoldsTable(ctx context.Context, tx pgx.Tx, l liveGen, seq int64) (string, error) {
	var touched []string
	var old []holdCols
	if r := f.resumed; r != nil {
		ps, ok := f.sets.(*pgSets)
		if !ok {
			return "", errors.New("audit: holds table digest: an incremental audit keeps its sets in PostgreSQL")
		}
		var err error
		if touched, err = ps.notedKeys(ctx, "holds", seq); err != nil {
			return "", err
		}
		for _, k := range touched {
			if c, ok := r.oldHolds[k]; ok {
				old = append(old, c)
			}
		}
	}
	args := append([]any{touched}, holdColumnsOf(old)...)
	var whole, untouched, oldSum string
	sql := fmt.Sprintf(holdsTableDigestSQL, projections.View("holds"))
	if err := tx.QueryRow(ctx, sql, args...).Scan(&whole, &untouched, &oldSum); err != nil {
		return "", fmt.Errorf("audit: holds table digest: %w", err)
	}
	if f.from == nil {
		return whole, nil
	}
	return whole, f.compareTableDigest(ctx, tx, l, tableDigest{table: "holds", checkpoint: f.from.HoldsTable, untouched: untouched, old: oldSum, touched: len(old)})
}

// holdColumnsOf hands rows as the columns holdsTableDigestSQL unnests ($2..$9).
func holdColumnsOf(rows []holdCols) []any {
	accs, ids, curs, sts, keys := make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	amounts, captured, exps := make([]int64, len(rows)), make([]int64, len(rows)), make([]*time.Time, len(rows))
	for i, r := range rows {
		accs[i], ids[i], curs[i], sts[i], keys[i] = r.account, r.id, r.currency, r.status, r.key
		amounts[i], captured[i], exps[i] = r.amount, r.captured, r.expires
	}
	return []any{accs, ids, amounts, curs, sts, captured, exps, keys}
}
