package audit

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/projections"
)

// An incremental audit of the whole ledger checks the accounts no event
// after its checkpoint touched through statements over every account
// (docs/design.md, "An incremental audit"): the accounts and holds tables'
// digests (tabledigest.go, holdsdigest.go), invariant 9 of the accounts
// not touched (effective.go), and the command_accounts rows against the
// accounts table's (cmdaccounts.go). Which accounts the fold touches is known only
// once it has run, but what these statements read is not: each table's
// digest whole, and every account whose history breaks invariant 9's rule
// for an untouched account, touched or not. So readUntouched reads those
// while the fold runs, in the audit's read-model snapshot on a connection of
// its own (sideReads), on the machine's other core; after the fold, the
// touched rows' hashes are subtracted from the digests (found by their
// accounts' index: a statement that grows with the touched accounts) and
// the touched accounts left out of the broken ones (untouchedFound). The
// audit reads what it read before, in the same snapshot, and decides what
// it decided. Its transaction holds the tables it has read until it has read
// them all (a rebuild's switch waits for that at most; liveSwitched names
// one that committed meanwhile), as a full audit's readActuals does.

// readUntouched starts reading, for an incremental audit of the whole
// ledger with the read models, what its checks of the untouched accounts
// read of every account (nothing otherwise); the function it returns stops
// the reading and waits for it.
func (r *auditRun) readUntouched(ctx context.Context) (stop func(), err error) {
	f := r.f
	if !f.incrementalOfAll(r.opts.Account) || r.tx == nil {
		return func() {}, nil
	}
	s := &sideReads{}
	for _, l := range r.lives {
		if r.behind(l) {
			continue // not compared
		}
		switch l.name {
		case projections.Accounts:
			s.add(sideName("digest", l), wholeDigest("accounts", accountsSQLs))
			s.add(sideName("holds", l), wholeDigest("holds", holdsSQLs))
		case projections.Commands:
			if r.accountsCompared() {
				s.add(sideName("command_accounts", l), untouchedCommandAccounts)
			}
		case projections.Balances, projections.Entries:
			s.add(sideName("untouched", l), func(ctx context.Context, q pgx.Tx) (any, error) {
				found, err := untouchedBroken(ctx, q, l)
				return found, err
			})
		}
	}
	r.untouched = s
	return s.stop, s.start(ctx, r)
}

// wholeDigest is the side read of a table's whole digest (sqls: its
// columns').
func wholeDigest(table string, sqls tableSQL) func(context.Context, pgx.Tx) (any, error) {
	return func(ctx context.Context, q pgx.Tx) (any, error) {
		var sum string
		if err := q.QueryRow(ctx, fmt.Sprintf(sqls.wholeDigest, projections.View(table))).Scan(&sum); err != nil {
			return nil, fmt.Errorf("audit: %s table digest: %w", table, err)
		}
		return sum, nil
	}
}

// wholeOf waits for the digest of table what ("digest": the accounts',
// "holds") of read model l read beside the fold: "" when none was.
func (r *auditRun) wholeOf(what string, l liveGen) (string, error) {
	sum, ok, err := r.untouched.wait(sideName(what, l))
	if !ok || err != nil {
		return "", err
	}
	return sum.(string), nil
}

// untouchedOf waits for the accounts read model l breaks invariant 9's rule
// for (untouchedBroken, read beside the fold) and keeps those not in
// touched (untouchedFound).
func (r *auditRun) untouchedOf(l liveGen, touched map[string]bool) ([]effectiveFound, int, error) {
	broken, ok, err := r.untouched.wait(sideName("untouched", l))
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, &UntouchedNotReadError{ReadModel: l.name}
	}
	found, unlisted := untouchedFound(broken.([]effectiveFound), func(id string) bool { return touched[id] }, r.f.MaxViolations)
	return found, unlisted, nil
}

// ErrUntouchedNotRead matches every *UntouchedNotReadError with errors.Is.
var ErrUntouchedNotRead = errors.New("audit: the accounts not touched: not read")

// UntouchedNotReadError refuses an incremental audit of the whole ledger
// whose check of read model ReadModel's accounts not touched by the fold was
// not read beside it (readUntouched): passing would leave those accounts
// unchecked.
type UntouchedNotReadError struct {
	ReadModel string
}

func (e *UntouchedNotReadError) Error() string {
	return fmt.Sprintf("audit: %s of the accounts not touched: not read", e.ReadModel)
}

// Is makes errors.Is(err, ErrUntouchedNotRead) true.
func (e *UntouchedNotReadError) Is(target error) bool { return target == ErrUntouchedNotRead }

// behind reports whether read model l's checkpoint is before an incremental
// audit's checkpoint: the fold never stood where it stands, so it is not
// compared.
func (r *auditRun) behind(l liveGen) bool {
	return r.f.from != nil && l.pos.Compare(r.f.from.Position) < 0
}
