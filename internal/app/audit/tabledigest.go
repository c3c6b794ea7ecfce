package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/projections"
)

// The accounts read model holds a row of every account, touched by the
// events after an audit checkpoint or not. An incremental audit compares the
// rows of the accounts its events touched one by one (as the fold expects
// them) and the others as a whole: the audit that stored the checkpoint
// found the table equal to its fold, at its head (every live read model
// there: checkpointable), and kept its digest (AuditCheckpoint.AccountsTable,
// migration 00014), an order-free sum of a 64-bit hash of each row
// (accountRowHash). The rows of the accounts not touched must still sum to
// it less the rows the touched ones had then (their checkpoint rows,
// resumedAccounts.old): a row of an untouched account edited, deleted or
// added since is caught, as a full audit catches it. PostgreSQL sums the
// table in one statement (one pass over it, a hash anti-join with the
// touched accounts), whose cost grows with the accounts, not the events.

// accountRowHash hashes an accounts row's compared columns (those openTable
// reads; available is balance - held) to a 64-bit integer: PostgreSQL renders
// the row from the table's columns or from the fold's values alike (same
// types), so that both hash the same text.
const accountRowHash = `('x' || substr(md5(ROW(account_id, currency, overdraft_limit, metadata, status, balance, held, balance - held, revision)::text), 1, 16))::bit(64)::bigint`

// accountsTableDigestSQL sums, in the read models' snapshot, the hashes of
// the accounts table's rows (%s: the live view) apart from the accounts $1
// (the whole table's, the others'), and of the rows $2..$9 (the touched
// accounts' checkpoint rows), each sum a decimal integer.
const accountsTableDigestSQL = `SELECT coalesce(sum(h), 0)::text, coalesce(sum(h) FILTER (WHERE t.id IS NULL), 0)::text,
	(SELECT coalesce(sum(` + accountRowHash + `), 0) FROM (SELECT account_id, currency, overdraft_limit, md::jsonb AS metadata, status, balance, held, revision
		FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::bigint[])
		AS o(account_id, currency, overdraft_limit, md, status, balance, held, revision)) o)::text
FROM (SELECT account_id, ` + accountRowHash + ` AS h FROM %s) a LEFT JOIN unnest($1::text[]) t(id) ON t.id = a.account_id`

// accountCols are an accounts row's compared columns, as the fold expects
// them (accountRowOf renders them).
type accountCols struct {
	id, currency, metadata, status string
	overdraft, balance, held, rev  int64
}

func accountColsOf(a *domain.Account) accountCols {
	return accountCols{id: a.ID, currency: a.Currency, metadata: metadataJSON(a.Metadata), status: string(a.Status()),
		overdraft: a.OverdraftLimit, balance: a.Balance, held: a.Held, rev: a.Revision}
}

// accountsTable is what checkAccountsTable found: the whole table's digest
// (a checkpoint stored at this audit's head keeps it).
type accountsTable struct{ digest string }

// checkAccountsTable sums the accounts read model l's rows in the snapshot
// tx and, in an incremental audit, compares those of the accounts not in
// touched (the accounts the fold had read as of l's checkpoint, compared row
// by row) with the checkpoint's digest less their checkpoint rows.
func (f *Fold) checkAccountsTable(ctx context.Context, tx pgx.Tx, l liveGen, touched []string) (accountsTable, error) {
	var old []accountCols
	if r := f.resumed; r != nil {
		for _, id := range touched {
			if c, ok := r.old[id]; ok {
				old = append(old, c)
			}
		}
	}
	args := []any{touched}
	args = append(args, columnsOf(old)...)
	var whole, untouched, oldSum string
	sql := fmt.Sprintf(accountsTableDigestSQL, projections.View("accounts"))
	if err := tx.QueryRow(ctx, sql, args...).Scan(&whole, &untouched, &oldSum); err != nil {
		return accountsTable{}, fmt.Errorf("audit: accounts table digest: %w", err)
	}
	if f.from == nil {
		return accountsTable{digest: whole}, nil
	}
	var want string
	if err := tx.QueryRow(ctx, `SELECT ($1::numeric - $2::numeric)::text`, f.from.AccountsTable, oldSum).Scan(&want); err != nil {
		return accountsTable{}, fmt.Errorf("audit: accounts table digest: %w", err)
	}
	if untouched != want {
		f.violate(Violation{Invariant: InvReadModel, Kind: "read_model_mismatch", Message: fmt.Sprintf(
			"read model %s (generation %d, at %s): the rows of the accounts no event after audit checkpoint %d touched sum to digest %s, the checkpoint's less the %d touched accounts' rows then to %s: a row of an untouched account was edited, deleted or added since (a full audit names it)",
			l.name, l.gen, l.pos, f.from.ID, untouched, len(old), want)})
	}
	return accountsTable{digest: whole}, nil
}

// columnsOf hands rows as the columns accountsTableDigestSQL unnests ($2..$9).
func columnsOf(rows []accountCols) []any {
	ids, curs, mds, sts := make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	ods, bals, helds, revs := make([]int64, len(rows)), make([]int64, len(rows)), make([]int64, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		ids[i], curs[i], mds[i], sts[i] = r.id, r.currency, r.metadata, r.status
		ods[i], bals[i], helds[i], revs[i] = r.overdraft, r.balance, r.held, r.rev
	}
	return []any{ids, curs, ods, mds, sts, bals, helds, revs}
}
