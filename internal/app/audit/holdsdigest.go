package audit

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
)

// The accounts read model's second table, holds, is compared as the
// accounts table is (tabledigest.go), its active holds whole: an incremental
// audit compares the rows of the holds its events touched one by one (the
// rows the fold noted), and the other active holds' rows as the sum of a
// 64-bit hash of each row (holdColumns), which must equal the checkpoint's
// digest of the active holds (AuditCheckpoint.ActiveHolds, migration 00018)
// less the touched holds' rows as the checkpoint's accounts held them, those
// active then (resumedAccounts.oldHolds). A hold is keyed account/hold, not
// by account: a touched account's holds that no event after the checkpoint
// touched are compared through the digest too. The checkpoint's snapshots
// keep every active hold. A hold closed (captured, released, expired)
// before the checkpoint is not compared: the table keeps every hold ever
// placed, and hashing them all made every incremental audit cost the whole
// history of holds (BENCHMARKS.md). Such a hold takes no event after the
// checkpoint (a capture or release of it does not fold, a placement of it
// again is named: hold_placed_again for the closed holds the snapshot kept,
// checkHoldPlaced, key_decided_twice for older ones through their claim,
// claimBefore), and its row is trusted as the history rows before the
// checkpoint are (TrustedFromCheckpoint): one edited and still closed,
// deleted, or a closed hold added, is caught by a full audit; one closed
// since the checkpoint is touched, compared row by row.

// holdCols are a holds row's compared columns, as the fold expects them
// (holdRowOf renders them) or as the table holds them.
type holdCols struct {
	account, id, currency, status, key string
	amount, captured                   int64
	expires                            *time.Time
}

// holdColumns is the one list of the holds table's compared columns, in
// order (as accountColumns is the accounts table's): its expiry hashed as
// microseconds since the epoch, since a timestamptz's text depends on the
// session's time zone.
var holdColumns = columns[holdCols]{
	{"account_id", "text", "", "", func(c *holdCols) any { return &c.account }},
	{"hold_id", "text", "", "", func(c *holdCols) any { return &c.id }},
	{"amount", "bigint", "", "", func(c *holdCols) any { return &c.amount }},
	{"currency", "text", "", "", func(c *holdCols) any { return &c.currency }},
	{"status", "text", "", "", func(c *holdCols) any { return &c.status }},
	{"captured", "bigint", "", "", func(c *holdCols) any { return &c.captured }},
	{"expires_at", "timestamptz", "", "(extract(epoch FROM %[1]s) * 1000000)::bigint", func(c *holdCols) any { return &c.expires }},
	{"idempotency_key", "text", "", "", func(c *holdCols) any { return &c.key }},
}

// holdsSQLs is derived once from holdColumns; a row's key is account/hold,
// a touched row found by its account and hold ($3, $4: holdLookup), and
// the rows compared whole are the active holds'.
var holdsSQLs = holdColumns.sqlBy("a.account_id || '/' || a.hold_id", "a.status = '"+string(domain.HoldStatusActive)+"'",
	"(a.account_id, a.hold_id) IN (SELECT * FROM unnest($3::text[], $4::text[]))", 2)

func holdColsOf(account, currency string, h *domain.Hold, captured int64) holdCols {
	var exp *time.Time
	if !h.ExpiresAt.IsZero() {
		t := h.ExpiresAt
		exp = &t
	}
	return holdCols{account: account, id: h.ID, currency: currency, status: string(h.Status), key: h.Key,
		amount: h.Amount, captured: captured, expires: exp}
}

// noteOldHolds keeps the active holds of account a, read from the
// checkpoint, as the holds table held them then: the rows its digest summed.
func (r *resumedAccounts) noteOldHolds(a *domain.Account) {
	for _, h := range a.Holds {
		if h.Status == domain.HoldStatusActive {
			r.oldHolds[a.ID+"/"+h.ID] = holdColsOf(a.ID, a.Currency, h, 0)
		}
	}
}

// checkHoldsTable sums the active holds of the accounts read model l in the
// snapshot tx and, in an incremental audit, compares the rows of those its
// events did not touch (up to seq, l's checkpoint) with the checkpoint's
// digest less the touched holds' checkpoint rows. It returns the active
// holds' digest. whole is that digest when it was read beside the fold
// (untouched.go; "": it is summed here).
func (f *Fold) checkHoldsTable(ctx context.Context, tx pgx.Tx, l liveGen, seq int64, whole string) (string, error) {
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
	d, err := sumTable(ctx, tx, "holds", holdsSQLs, tableSum{touched: touched, lookup: holdLookup(touched), old: holdColumns.arrays(old), whole: whole})
	if err != nil || f.from == nil {
		return d.whole, err
	}
	d.checkpoint, d.touched = f.from.ActiveHolds, len(old)
	return d.whole, f.compareTableDigest(ctx, tx, l, d)
}

// holdLookup is holdsSQLs' lookup of the holds keyed keys (account/hold):
// the (account, hold) primary keys they may be of, accounts and holds
// apart, each key split at each of its slashes (an account's ID may hold
// one), so that the holds of the keys are found by their primary key, an
// index probe a touched hold. Found by their accounts instead, every hold
// ever placed on an account with a touched hold was read (the table keeps
// closed holds): a touched account's whole history of holds (BENCHMARKS.md,
// "incr2").
func holdLookup(keys []string) []any {
	var accounts, holds []string
	for _, k := range keys {
		for i := range len(k) {
			if k[i] == '/' {
				accounts, holds = append(accounts, k[:i]), append(holds, k[i+1:])
			}
		}
	}
	return []any{accounts, holds}
}
