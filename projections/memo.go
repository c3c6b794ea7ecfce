package projections

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
)

// accountMemo is what a rebuild's builder of one generation remembers, between
// its batches, of each account's last row in that generation: the balance
// history's last row (balances) or the command fold's account (commands), which
// each batch would otherwise read back with one index descent per account
// (lastBalances, loadCmdAccounts). It is sound because a generation being built
// has one writer, its builder: nothing else changes the rows it remembers. It
// lives as long as one Rebuild call's load (dropped before its check), and is
// updated as a batch is applied,
// before its commit: a batch that fails fails the rebuild, and the memo goes
// with it (a resumed rebuild starts with an empty one).
//
// Its size is bounded by memoAccountsLimit: past it, accounts not yet in it are
// read from the generation as before.
type accountMemo struct {
	// complete: every account with a row in the generation is in m (the
	// generation was created empty by this rebuild and m never reached its
	// bound), so an account not in m has no row.
	complete bool
	// keyed: the generation's read-back key is known to be there
	// (ensureReadBackKey). A rebuild creates a generation without it
	// (migration 00031): a complete memo reads nothing back.
	keyed bool
	// unwritten: the generation has none of the rows the memo holds: a
	// commands builder's fresh generation, whose command_accounts rows the
	// memo holds until they are written once (holdCmdAccounts).
	unwritten bool
	// indexMemMiB is the rebuild's index memory (RebuildOptions.IndexMemoryMiB),
	// which the read-back key's build in a batch uses too (ensureReadBackKey).
	indexMemMiB int
	m           map[string]memoRow
	// names are the currencies and statuses the rows name, each once, and
	// index their places in it: a row holds two small numbers, not two
	// strings (and not the decoded events' strings, which it would keep).
	names []string
	index map[string]uint16
}

// memoAccount is an account's last row: its state after its last event applied,
// and that event's revision (-1: none).
type memoAccount struct {
	state BalanceState
	rev   int64
}

// memoRow is how the memo holds a memoAccount: 32 bytes against 56, its
// currency and status as indexes into the memo's names.
type memoRow struct {
	balance, held, rev int64
	currency, status   uint16
}

// memoAccountsLimit bounds the accounts an accountMemo holds (measured with
// the map's share: 21.6 MB for the two memos, balance history's and the
// commands', over 200,000 accounts each, about 54 bytes an account and memo;
// at this bound the maps have just grown their tables: 13.1 MB for both at
// 100,000 accounts, 26.5 MB at 120,000, about 110 bytes an account and memo,
// the account IDs' strings not counted; review r472).
// Where the rebuild's heap is at the read tools' memory limit every byte
// kept costs the collector, which outweighed what a memo of every account
// saved PostgreSQL while the balance history's key was kept during the load:
// over 200,000 accounts a bound of 50,000 took 0.92x the CPU of one of
// 200,000 (BENCHMARKS.md, "Issue 23: the rebuild's own live heap"). Since
// 00031 a balances memo that holds every account also spares PostgreSQL that
// key during the load (built after it: one sort): over 100,000 accounts (the
// lead's shape) a bound of 120,000 took 0.90x and 0.86x of PostgreSQL's CPU
// of the bound of 50,000 with the key kept (0.96x of it the key's), the
// process's and the peak RSS the same (BENCHMARKS.md, "Issue 23, histpk").
// A variable for the tests of a rebuild past it.
var memoAccountsLimit = 120_000

// memoNamesLimit bounds a memo's names (the most a uint16 indexes): an
// account whose currency or status would be past it is not remembered.
const memoNamesLimit = 1 << 16

// newAccountMemo returns an empty memo; complete when its generation is empty.
func newAccountMemo(complete bool) *accountMemo {
	return &accountMemo{complete: complete, m: map[string]memoRow{}, index: map[string]uint16{}}
}

// recall calls found with each account of ids the memo answers (an account it
// does not hold, when complete, as one with no row: revision -1, the zero
// state) and returns the ids left to read from the generation. A nil memo
// answers none.
func (am *accountMemo) recall(ids []string, found func(id string, a memoAccount)) (unknown []string) {
	if am == nil {
		return ids
	}
	for _, id := range ids {
		r, ok := am.m[id]
		switch {
		case ok:
			found(id, am.account(r))
		case am.complete:
			found(id, memoAccount{rev: -1})
		default:
			unknown = append(unknown, id)
		}
	}
	return unknown
}

// remember records an account's last row; past the bound it records a new
// account no more, and the memo is no longer complete.
func (am *accountMemo) remember(id string, a memoAccount) {
	if am == nil {
		return
	}
	_, known := am.m[id]
	if !known && len(am.m) >= memoAccountsLimit {
		am.complete = false
		return
	}
	currency, ok1 := am.name(a.state.Currency)
	status, ok2 := am.name(string(a.state.Status))
	if !ok1 || !ok2 { // past the names' bound: read back from the generation
		delete(am.m, id)
		am.complete = false
		return
	}
	am.m[id] = memoRow{balance: a.state.Balance, held: a.state.Held, rev: a.rev, currency: currency, status: status}
}

// account is the memoAccount a row holds.
func (am *accountMemo) account(r memoRow) memoAccount {
	return memoAccount{
		state: BalanceState{Currency: am.names[r.currency], Balance: r.balance, Held: r.held, Status: domain.AccountStatus(am.names[r.status])},
		rev:   r.rev,
	}
}

// name returns the index of s in the memo's names, adding it (a copy: not
// the decoded event's string) if it is new; false past memoNamesLimit.
func (am *accountMemo) name(s string) (uint16, bool) {
	if i, ok := am.index[s]; ok {
		return i, true
	}
	if len(am.names) >= memoNamesLimit {
		return 0, false
	}
	s = strings.Clone(s)
	am.names = append(am.names, s)
	am.index[s] = uint16(len(am.names) - 1)
	return am.index[s], true
}

// memoApplier is a projection whose Apply can use its builder's memo (Apply is
// applyWith without one).
type memoApplier interface {
	applyWith(ctx context.Context, tx pgx.Tx, gen int, events []*Event, memo *accountMemo) error
}
