package audit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/projections"
)

// The commands read model keeps its own fold of every account
// (command_accounts: currency, balance, held and revision, of every account
// stream with an event, opened or not; projections/commands.go), from which
// it builds the replies of later commands. The audit compares it with its
// fold as it compares the accounts table (commandAccountColumns: that
// table's columns of the same names, read and rendered alike), a row at a
// time, as of the commands read model's checkpoint: in a full audit, and in
// a rebuild's check (ProjectionTables), every row; in an incremental audit,
// the rows of the accounts its fold read by its end (commandAccountsExpected)
// and, of the whole ledger, the others through the accounts table
// (checkUntouchedCommandAccounts).

// commandAccountsExpected is what an incremental audit expects of
// command_accounts, given e, what the fold expected as of the commands read
// model's checkpoint: the rows of every account it read by its end
// (touched), those it read after that checkpoint as the audit checkpoint
// has them (no event of theirs is at or before the read model's checkpoint,
// so its row is still theirs then). A full audit's is e.
func (r *auditRun) commandAccountsExpected(e expectation, touched map[string]bool) expectation {
	f, account := r.f, r.opts.Account
	if f.resumed == nil {
		return e
	}
	rows := maps.Clone(e.rows["command_accounts"])
	then := make(map[string]bool, len(e.accounts)) // read by the read model's checkpoint
	for _, id := range e.accounts {
		then[id] = true
	}
	keys := make([]string, 0, len(touched))
	for id := range touched {
		if account != "" && id != account {
			continue
		}
		keys = append(keys, id)
		if then[id] {
			continue // the fold's row as of the read model's checkpoint (none: no event folded)
		}
		if c, ok := f.resumed.checkpointMoney(id); ok {
			rows[id] = row(commandAccountColumns.values(&c)...)
		}
	}
	out := e
	out.rows = maps.Clone(e.rows)
	out.rows["command_accounts"], out.accounts = rows, keys
	return out
}

// checkpointMoney is account id as the audit checkpoint has it (read into
// the fold), as command_accounts holds it; false: the checkpoint has no
// event of it.
func (r *resumedAccounts) checkpointMoney(id string) (accountCols, bool) {
	if c, ok := r.old[id]; ok { // open
		return c, true
	}
	at, ok := r.at[id] // never opened: no currency, nothing held
	if !ok || at[0] < 0 {
		return accountCols{}, false
	}
	return accountCols{id: id, balance: at[1], rev: at[0]}, true
}

// untouchedCommandAccountsSQL compares, in the read models' snapshot, the
// command_accounts rows with their rows of the accounts table, column by
// column (commandAccountColumns): the keys of the rows that differ or lack a
// command_accounts row, and of the command_accounts rows the accounts table
// has no row of, each in order. It reads every account, beside the fold
// (readUntouched): which accounts the fold touches, whose rows it leaves out
// (untouchedCommandAccounts), is known only after it. The keys are few: a
// row of an account not touched differs only when corrupt, one touched only
// when the two read models stand apart; the second, the accounts never
// opened.
var untouchedCommandAccountsSQL = func() string {
	var c, a []string
	for _, col := range commandAccountColumns[1:] {
		c, a = append(c, "c."+col.name), append(a, "a."+col.name)
	}
	differ := `c.account_id IS NULL OR (a.account_id IS NOT NULL AND (` + strings.Join(c, ", ") + `) IS DISTINCT FROM (` + strings.Join(a, ", ") + `))`
	return `SELECT coalesce(array_agg(coalesce(c.account_id, a.account_id) ORDER BY coalesce(c.account_id, a.account_id)) FILTER (WHERE ` + differ + `), '{}'),
	coalesce(array_agg(c.account_id ORDER BY c.account_id) FILTER (WHERE a.account_id IS NULL), '{}')
FROM ` + projections.View("command_accounts") + ` c FULL JOIN ` + projections.View("accounts") + ` a ON a.account_id = c.account_id`
}()

// untouchedCommandAccounts is the side read of untouchedCommandAccountsSQL:
// the keys that differ, and those without an accounts row.
func untouchedCommandAccounts(ctx context.Context, q pgx.Tx) (any, error) {
	var keys [2][]string
	if err := q.QueryRow(ctx, untouchedCommandAccountsSQL).Scan(&keys[0], &keys[1]); err != nil {
		return nil, fmt.Errorf("audit: command_accounts of the untouched accounts: %w", err)
	}
	return keys, nil
}

// checkUntouchedCommandAccounts compares, in an incremental audit of the
// whole ledger, the command_accounts rows of the accounts it did not read
// (not in touched: no event after its checkpoint is theirs, so each row is
// as the checkpoint has the account) with their rows of the accounts table,
// whose rows of those accounts the audit compares whole with its
// checkpoint's digest (checkAccountsTable): every such row of one table
// must equal its row of the other, in the columns both hold, but for the
// accounts never opened, which the accounts table has no row of: there
// must be as many command_accounts rows without an accounts row as the
// checkpoint has never-opened accounts the fold did not read. The rows were
// read beside the fold (readUntouched). It returns why it did not compare
// them ("": it did).
func (r *auditRun) checkUntouchedCommandAccounts(l liveGen, touched map[string]bool) (string, error) {
	f := r.f
	if !f.incrementalOfAll(r.opts.Account) || r.tx == nil {
		return "", nil
	}
	if !r.accountsCompared() {
		return "the rows of the accounts no event after the audit checkpoint touched: the accounts read model they are compared through is not compared", nil
	}
	read, ok, err := r.untouched.wait(sideName("command_accounts", l))
	if err != nil {
		return "", err
	}
	if !ok {
		return "", &UntouchedNotReadError{ReadModel: l.name}
	}
	keys := read.([2][]string)
	untouched := func(ids []string) []string {
		return slices.DeleteFunc(ids, func(id string) bool { return touched[id] })
	}
	differKeys, orphanKeys := untouched(keys[0]), untouched(keys[1])
	differ, orphans := int64(len(differKeys)), int64(len(orphanKeys))
	if want := f.resumed.neverOpenedUnread(); differ > 0 || orphans != want {
		f.violate(Violation{Invariant: InvReadModel, Kind: "read_model_mismatch", Message: fmt.Sprintf(
			"read model %s (generation %d, at %s): table command_accounts: of the accounts no event after audit checkpoint %d touched, %d rows differ from (or lack) their row of the accounts table %q, and %d rows have no row there %q, where the checkpoint's never-opened accounts are %d",
			l.name, l.gen, l.pos, f.from.ID, differ, firstKeys(differKeys), orphans, firstKeys(orphanKeys), want)})
	}
	return "", nil
}

// firstKeys are the first five of keys, which a message names.
func firstKeys(keys []string) []string { return keys[:min(len(keys), 5)] }

// accountsCompared reports whether the audit compares the accounts read
// model (live, and not behind its checkpoint), through which
// checkUntouchedCommandAccounts compares the untouched accounts'
// command_accounts rows.
func (r *auditRun) accountsCompared() bool {
	i := slices.IndexFunc(r.lives, func(a liveGen) bool { return a.name == projections.Accounts })
	return i >= 0 && !r.behind(r.lives[i])
}

// neverOpenedUnread is how many of the checkpoint's accounts were never
// opened (a stream with events, no accounts row) and not read into the
// fold: its account rows not read less its open accounts not read.
func (r *resumedAccounts) neverOpenedUnread() int64 {
	n := r.rows - r.loaded
	for _, t := range r.untouched {
		n -= int64(t.Accounts)
	}
	return n
}
