package audit

import (
	"context"
	"fmt"
	"strings"

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
// (accountsSQL's hash). The rows of the accounts not touched must still sum to
// it less the rows the touched ones had then (their checkpoint rows,
// resumedAccounts.old): a row of an untouched account edited, deleted or
// added since is caught, as a full audit catches it. PostgreSQL sums the
// table in one statement (one pass over it, a hash anti-join with the
// touched accounts), whose cost grows with the accounts, not the events.

// accountCols are an accounts row's compared columns, as the fold expects
// them or as the table holds them (its metadata as metadataJSON renders it).
type accountCols struct {
	id, currency, metadata, status           string
	overdraft, balance, held, available, rev int64
}

func accountColsOf(a *domain.Account) accountCols {
	return accountCols{id: a.ID, currency: a.Currency, metadata: metadataJSON(a.Metadata), status: string(a.Status()),
		overdraft: a.OverdraftLimit, balance: a.Balance, held: a.Held, available: a.Balance - a.Held, rev: a.Revision}
}

// accountColumns is the one list of the accounts table's compared columns,
// in order: what openTable selects and scans (accountsSQLs.selects, ptrs), the row
// the comparison renders (accountRowOf), what the digest hashes
// (accountsSQL's hash) and the fold's rows it unnests (columnsOf). A column
// added here is compared everywhere.
var accountColumns = []struct {
	name string                   // the table's column
	text bool                     // text (else bigint)
	cast string                   // the column's type when not text or bigint: read as text, cast back to hash
	ptr  func(c *accountCols) any // the field
}{
	{"account_id", true, "", func(c *accountCols) any { return &c.id }},
	{"currency", true, "", func(c *accountCols) any { return &c.currency }},
	{"overdraft_limit", false, "", func(c *accountCols) any { return &c.overdraft }},
	{"metadata", true, "jsonb", func(c *accountCols) any { return &c.metadata }},
	{"status", true, "", func(c *accountCols) any { return &c.status }},
	{"balance", false, "", func(c *accountCols) any { return &c.balance }},
	{"held", false, "", func(c *accountCols) any { return &c.held }},
	{"available", false, "", func(c *accountCols) any { return &c.available }},
	{"revision", false, "", func(c *accountCols) any { return &c.rev }},
}

// ptrs are c's fields in accountColumns' order (to scan into).
func (c *accountCols) ptrs() []any {
	out := make([]any, len(accountColumns))
	for i, col := range accountColumns {
		out[i] = col.ptr(c)
	}
	return out
}

// values are c's fields in accountColumns' order.
func (c *accountCols) values() []any {
	out := c.ptrs()
	for i, p := range out {
		switch v := p.(type) {
		case *string:
			out[i] = *v
		case *int64:
			out[i] = *v
		}
	}
	return out
}

// accountsSQLText is what accountsSQL derives from accountColumns.
type accountsSQLText struct {
	// selects is the columns openTable selects.
	selects string
	// tableDigest sums the accounts table's row hashes (checkAccountsTable).
	tableDigest string
}

// accountsSQLs is derived once from accountColumns (accountsSQL).
var accountsSQLs = accountsSQL()

// accountsSQL derives from accountColumns the columns openTable selects, the
// hash of a row's compared columns to a 64-bit integer (PostgreSQL renders
// the row from the table's columns or from the fold's values alike, same
// types, so that both hash the same text), and the statement that sums, in
// the read models' snapshot, the hashes of the accounts table's rows (%s: the
// live view) apart from the accounts $1 (the whole table's, the others'), and
// of the rows $2... (the touched accounts' checkpoint rows, a column each),
// each sum a decimal integer.
func accountsSQL() accountsSQLText {
	var sel, names, arrays, back []string
	for i, c := range accountColumns {
		typ, name := "bigint", c.name
		if c.text {
			typ = "text"
		}
		if c.cast != "" {
			name = c.name + "::text"
		}
		sel, names = append(sel, name), append(names, c.name)
		arrays = append(arrays, fmt.Sprintf("$%d::%s[]", i+2, typ))
		if c.cast != "" {
			back = append(back, c.name+"::"+c.cast+" AS "+c.name)
		} else {
			back = append(back, c.name)
		}
	}
	hash := `('x' || substr(md5(ROW(` + strings.Join(names, ", ") + `)::text), 1, 16))::bit(64)::bigint`
	digest := `SELECT coalesce(sum(h), 0)::text, coalesce(sum(h) FILTER (WHERE t.id IS NULL), 0)::text,
	(SELECT coalesce(sum(` + hash + `), 0) FROM (SELECT ` + strings.Join(back, ", ") + `
		FROM unnest(` + strings.Join(arrays, ", ") + `) AS o(` + strings.Join(names, ", ") + `)) o)::text
FROM (SELECT account_id, ` + hash + ` AS h FROM %s) a LEFT JOIN unnest($1::text[]) t(id) ON t.id = a.account_id`
	return accountsSQLText{selects: strings.Join(sel, ", "), tableDigest: digest}
}

// accountsTable is what checkAccountsTable and checkHoldsTable found: the
// whole tables' digests (a checkpoint stored at this audit's head keeps them).
type accountsTable struct{ digest, holds string }

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
	sql := fmt.Sprintf(accountsSQLs.tableDigest, projections.View("accounts"))
	if err := tx.QueryRow(ctx, sql, args...).Scan(&whole, &untouched, &oldSum); err != nil {
		return accountsTable{}, fmt.Errorf("audit: accounts table digest: %w", err)
	}
	if f.from == nil {
		return accountsTable{digest: whole}, nil
	}
	return accountsTable{digest: whole}, f.compareTableDigest(ctx, tx, l, tableDigest{table: "accounts", checkpoint: f.from.AccountsTable, untouched: untouched, old: oldSum, touched: len(old)})
}

// tableDigest is what an incremental audit found of a read-model table
// compared whole: the checkpoint's digest of it, the sum of the rows it did
// not touch, and the sum of the touched rows as the checkpoint had them.
type tableDigest struct {
	table, checkpoint, untouched, old string
	touched                           int
}

// compareTableDigest reports a violation unless the untouched rows of read
// model l's table d.table sum to the checkpoint's digest less the touched
// rows then.
func (f *Fold) compareTableDigest(ctx context.Context, tx pgx.Tx, l liveGen, d tableDigest) error {
	var want string
	if err := tx.QueryRow(ctx, `SELECT ($1::numeric - $2::numeric)::text`, d.checkpoint, d.old).Scan(&want); err != nil {
		return fmt.Errorf("audit: %s table digest: %w", d.table, err)
	}
	if d.untouched != want {
		f.violate(Violation{Invariant: InvReadModel, Kind: "read_model_mismatch", Message: fmt.Sprintf(
			"read model %s (generation %d, at %s): the rows of table %s no event after audit checkpoint %d touched sum to digest %s, the checkpoint's less the %d touched rows then to %s: an untouched row was edited, deleted or added since (a full audit names it)",
			l.name, l.gen, l.pos, d.table, f.from.ID, d.untouched, d.touched, want)})
	}
	return nil
}

// columnsOf hands rows as the columns accountsSQLs.tableDigest unnests ($2...).
func columnsOf(rows []accountCols) []any {
	out := make([]any, len(accountColumns))
	for i, c := range accountColumns {
		if c.text {
			out[i] = make([]string, len(rows))
		} else {
			out[i] = make([]int64, len(rows))
		}
	}
	for j := range rows {
		for i, v := range rows[j].values() {
			switch x := v.(type) {
			case string:
				out[i].([]string)[j] = x
			case int64:
				out[i].([]int64)[j] = x
			}
		}
	}
	return out
}
