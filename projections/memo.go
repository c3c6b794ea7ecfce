package projections

import (
	"context"

	"github.com/jackc/pgx/v5"
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
	m        map[string]memoAccount
}

// memoAccount is an account's last row: its state after its last event applied,
// and that event's revision (-1: none).
type memoAccount struct {
	state BalanceState
	rev   int64
}

// memoAccountsLimit bounds the accounts an accountMemo holds (about 150 bytes
// each with the map's share: 30 MiB at the bound, for each of the two memos,
// balance history's and the commands'). A variable for the tests
// of a rebuild past it.
var memoAccountsLimit = 200_000

// newAccountMemo returns an empty memo; complete when its generation is empty.
func newAccountMemo(complete bool) *accountMemo {
	return &accountMemo{complete: complete, m: map[string]memoAccount{}}
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
		a, ok := am.m[id]
		switch {
		case ok:
			found(id, a)
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
	if _, ok := am.m[id]; !ok && len(am.m) >= memoAccountsLimit {
		am.complete = false
		return
	}
	am.m[id] = a
}

// memoApplier is a projection whose Apply can use its builder's memo (Apply is
// applyWith without one).
type memoApplier interface {
	applyWith(ctx context.Context, tx pgx.Tx, gen int, events []*Event, memo *accountMemo) error
}
