package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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
	c := accountMoneyOf(a)
	c.metadata, c.status, c.overdraft, c.available = metadataJSON(a.Metadata), string(a.Status()), a.OverdraftLimit, a.Balance-a.Held
	return c
}

// accountMoneyOf is what both the accounts table and the commands
// projection's own fold (command_accounts) hold of an account: its ID,
// currency, balance, held and revision.
func accountMoneyOf(a *domain.Account) accountCols {
	return accountCols{id: a.ID, currency: a.Currency, balance: a.Balance, held: a.Held, rev: a.Revision}
}

// accountColumns is the one list of the accounts table's compared columns,
// in order: what openTable selects and scans, the row the comparison renders
// (accountRowOf), what the digest hashes and the fold's rows it unnests. A
// column added here is compared everywhere.
var accountColumns = columns[accountCols]{
	{"account_id", "text", "", "", func(c *accountCols) any { return &c.id }},
	{"currency", "text", "", "", func(c *accountCols) any { return &c.currency }},
	{"overdraft_limit", "bigint", "", "", func(c *accountCols) any { return &c.overdraft }},
	{"metadata", "text", "jsonb", "", func(c *accountCols) any { return &c.metadata }},
	{"status", "text", "", "", func(c *accountCols) any { return &c.status }},
	{"balance", "bigint", "", "", func(c *accountCols) any { return &c.balance }},
	{"held", "bigint", "", "", func(c *accountCols) any { return &c.held }},
	{"available", "bigint", "", "", func(c *accountCols) any { return &c.available }},
	{"revision", "bigint", "", "", func(c *accountCols) any { return &c.rev }},
}

// accountsSQLs is derived once from accountColumns; a row's key is its account.
var accountsSQLs = accountColumns.sql("a.account_id", "true")

// commandAccountColumns are the compared columns of the commands
// projection's own fold of each account (readmodel.command_accounts,
// projections/commands.go): the accounts table's of the same names
// (accountMoneyOf), read and rendered as that table's are.
var commandAccountColumns = accountColumns.named("account_id", "currency", "balance", "held", "revision")

// commandAccountsSelects is what openTable selects of command_accounts.
var commandAccountsSelects = commandAccountColumns.sql("a.account_id", "true").selects

// column is one compared column of a read-model table compared whole (the
// accounts read model's two tables: accountColumns, holdColumns), for the
// rows of type C that the fold expects and the table is read into.
type column[C any] struct {
	name string // the table's column
	typ  string // text, bigint or timestamptz: how it is read and the fold's values unnested
	cast string // the column's type when it is not typ: read as typ, cast back to hash it
	hash string // what is hashed of it ("": the column; %[1]s stands for it)
	ptr  func(c *C) any
}

// columns is a table's compared columns, in order.
type columns[C any] []column[C]

// named is the columns of cs of these names, in this order; a name cs lacks
// is a programming error.
func (cs columns[C]) named(names ...string) columns[C] {
	out := make(columns[C], 0, len(names))
	for _, n := range names {
		i := slices.IndexFunc(cs, func(c column[C]) bool { return c.name == n })
		if i < 0 {
			panic("audit: no compared column " + n)
		}
		out = append(out, cs[i])
	}
	return out
}

// ptrs are c's fields in the columns' order (to scan into).
func (cs columns[C]) ptrs(c *C) []any {
	out := make([]any, len(cs))
	for i, col := range cs {
		out[i] = col.ptr(c)
	}
	return out
}

// values are c's fields in the columns' order.
func (cs columns[C]) values(c *C) []any {
	out := cs.ptrs(c)
	for i, p := range out {
		switch v := p.(type) {
		case *string:
			out[i] = *v
		case *int64:
			out[i] = *v
		case **time.Time:
			out[i] = *v
		}
	}
	return out
}

// appendRaw appends to dst the text of the row at r, its columns selected
// in cs's order (openTable), as row renders the columns' values (values):
// text quoted, bigint in decimal, timestamptz or null, and a jsonb
// column's text as metadataJSON renders the map it holds.
func (cs columns[C]) appendRaw(dst []byte, r *rawRow) []byte {
	var buf [rowTextBytes]byte
	rt := newRowText(&buf)
	for i, c := range cs {
		switch {
		case c.cast == "jsonb":
			m, err := metadataOf(r.text(i))
			if err != nil {
				r.fail(i, err)
			}
			rt = rt.str(metadataJSON(m))
		case c.typ == "text":
			rt = quoted(rt, r.text(i))
		case c.typ == "bigint":
			rt = rt.num(r.int8(i))
		default:
			if at, ok := r.atOrNull(i); ok {
				rt = rt.at(at)
			} else {
				rt = rt.atOrNull(nil)
			}
		}
	}
	return append(dst, rt.b...)
}

// arrays hands rows as the columns the digest unnests ($2...), an array a
// column.
func (cs columns[C]) arrays(rows []C) []any {
	out := make([]any, len(cs))
	for i, col := range cs {
		switch col.typ {
		case "text":
			out[i] = make([]string, len(rows))
		case "bigint":
			out[i] = make([]int64, len(rows))
		default:
			out[i] = make([]*time.Time, len(rows))
		}
	}
	for j := range rows {
		for i, v := range cs.values(&rows[j]) {
			switch x := v.(type) {
			case string:
				out[i].([]string)[j] = x
			case int64:
				out[i].([]int64)[j] = x
			case *time.Time:
				out[i].([]*time.Time)[j] = x
			}
		}
	}
	return out
}

// tableSQL is what columns.sql derives.
type tableSQL struct {
	// selects is the columns openTable selects.
	selects string
	// tableDigest sums the table's row hashes (compareTable).
	tableDigest string
	// wholeDigest sums the hashes of the rows compared whole, all of them;
	// touchedDigest, given that sum ($2), subtracts from it those of the
	// rows of the keys $1 (found by their primary key, the arrays $3...:
	// tableSum.lookup) and sums the rows after those arrays (untouched.go).
	wholeDigest, touchedDigest string
}

// sql derives from the columns those openTable selects, the hash of a row's
// compared columns to a 64-bit integer (PostgreSQL renders the row from the
// table's columns or from the fold's values alike, same types, so that both
// hash the same text), and the statement that sums, in the read models'
// snapshot, the hashes of the table's rows compared whole (%s: the live
// view; where: which rows, over the table's alias a) apart from the rows of
// the keys $1 (key: a row's key, over a; the sum of all of them, of the
// others), and of the rows $2... (the touched rows as the checkpoint had
// them, a column each), each sum a decimal integer; and the two statements
// that make that sum in two (tableSQL's wholeDigest and touchedDigest),
// for a table keyed by its account: a touched row found by it ($3).
func (cs columns[C]) sql(key, where string) tableSQL {
	return cs.sqlBy(key, where, "a.account_id = ANY($3::text[])", 1)
}

// sqlBy is sql for a table whose touched rows lookup finds by its primary
// key from the arrays $3 to $(2+lookups) (tableSum.lookup), so that what
// touchedDigest reads grows with the rows touched, never with the rest of
// their accounts' rows.
func (cs columns[C]) sqlBy(key, where, lookup string, lookups int) tableSQL {
	var sel, names, hashed, back []string
	for _, c := range cs {
		name := c.name
		if c.cast != "" {
			name = c.name + "::" + c.typ
		}
		h := c.name
		if c.hash != "" {
			h = fmt.Sprintf(c.hash, c.name)
		}
		sel, names, hashed = append(sel, name), append(names, c.name), append(hashed, h)
		if c.cast != "" {
			back = append(back, c.name+"::"+c.cast+" AS "+c.name)
		} else {
			back = append(back, c.name)
		}
	}
	hash := `('x' || substr(md5(ROW(` + strings.Join(hashed, ", ") + `)::text), 1, 16))::bit(64)::bigint`
	old := func(first int) string { // the sum of the rows unnested from $first...
		arrays := make([]string, len(cs))
		for i, c := range cs {
			arrays[i] = fmt.Sprintf("$%d::%s[]", i+first, c.typ)
		}
		return `(SELECT coalesce(sum(` + hash + `), 0) FROM (SELECT ` + strings.Join(back, ", ") + `
		FROM unnest(` + strings.Join(arrays, ", ") + `) AS o(` + strings.Join(names, ", ") + `)) o)::text`
	}
	return tableSQL{
		selects: strings.Join(sel, ", "),
		tableDigest: `SELECT coalesce(sum(h), 0)::text, coalesce(sum(h) FILTER (WHERE t.k IS NULL), 0)::text,
	` + old(2) + `
FROM (SELECT ` + key + ` AS k, ` + hash + ` AS h FROM %s a WHERE ` + where + `) a LEFT JOIN unnest($1::text[]) t(k) ON t.k = a.k`,
		wholeDigest: `SELECT coalesce(sum(` + hash + `), 0)::text FROM %s a WHERE ` + where,
		touchedDigest: `SELECT ($2::numeric - coalesce(sum(` + hash + `), 0))::text, ` + old(3+lookups) + `
FROM %s a WHERE ` + where + ` AND ` + lookup + ` AND ` + key + ` = ANY($1::text[])`,
	}
}

// accountsTable is what checkAccountsTable and checkHoldsTable found: the
// whole tables' digests (a checkpoint stored at this audit's head keeps them).
type accountsTable struct{ digest, holds string }

// checkAccountsTable sums the accounts read model l's rows in the snapshot
// tx and, in an incremental audit, compares those of the accounts not in
// touched (the accounts the fold had read as of l's checkpoint, compared row
// by row) with the checkpoint's digest less their checkpoint rows. whole is
// the table's digest when it was read beside the fold (untouched.go; "": it
// is summed here).
func (f *Fold) checkAccountsTable(ctx context.Context, tx pgx.Tx, l liveGen, touched []string, whole string) (accountsTable, error) {
	var old []accountCols
	if r := f.resumed; r != nil {
		for _, id := range touched {
			if c, ok := r.old[id]; ok {
				old = append(old, c)
			}
		}
	}
	d, err := sumTable(ctx, tx, "accounts", accountsSQLs, tableSum{touched: touched, lookup: []any{touched}, old: accountColumns.arrays(old), whole: whole})
	if err != nil || f.from == nil {
		return accountsTable{digest: d.whole}, err
	}
	d.checkpoint, d.touched = f.from.AccountsTable, len(old)
	return accountsTable{digest: d.whole}, f.compareTableDigest(ctx, tx, l, d)
}

// tableSum is what sumTable sums of a table: the keys of the rows touched
// (and their primary keys, the arrays of tableSQL's lookup), the touched
// rows as the checkpoint had them (as columns), and the whole table's
// digest when it was read beside the fold ("": not read).
type tableSum struct {
	touched     []string
	lookup, old []any
	whole       string
}

// sumTable sums, in the snapshot tx, the hashes of the live table's rows
// (sqls: its columns'; or takes s.whole, read beside the fold), those of
// the rows whose keys are not in s.touched (the whole less the touched
// rows', read by their accounts' index), and those of s.old.
func sumTable(ctx context.Context, tx pgx.Tx, table string, sqls tableSQL, s tableSum) (tableDigest, error) {
	d := tableDigest{table: table, whole: s.whole}
	var err error
	if s.whole == "" {
		sql := fmt.Sprintf(sqls.tableDigest, projections.View(table))
		err = tx.QueryRow(ctx, sql, append([]any{s.touched}, s.old...)...).Scan(&d.whole, &d.untouched, &d.old)
	} else {
		sql := fmt.Sprintf(sqls.touchedDigest, projections.View(table))
		args := append(append([]any{s.touched, s.whole}, s.lookup...), s.old...)
		err = tx.QueryRow(ctx, sql, args...).Scan(&d.untouched, &d.old)
	}
	if err != nil {
		return d, fmt.Errorf("audit: %s table digest: %w", table, err)
	}
	return d, nil
}

// tableDigest is what an audit found of a read-model table compared whole:
// the sum of its rows, and in an incremental audit the checkpoint's digest of
// it, the sum of the rows it did not touch, and the sum of the touched rows
// as the checkpoint had them.
type tableDigest struct {
	table, checkpoint, whole, untouched, old string
	touched                                  int
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
