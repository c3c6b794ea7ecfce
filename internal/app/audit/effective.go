package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// Invariant 9, effective times (PROTOCOL.md §2.3): every account event's
// effective time lies within what the ledger allows (never more than
// domain.MaxEffectiveSkew after its record time, never before its account's
// effective opening), and the balance by effective time at the end of time,
// as the balances read model answers it (projections.EffectiveBalances, what
// query.balance with effective_at reads), equals the balance by record time of
// the fold, account by account. The fold keeps, per account, its effective
// opening (domain.Account.EffectiveFrom) and, as of the balances read model's
// checkpoint, its balance and held amount: per-account state, never per event
// (issue 23's bound); the read model's rows are streamed.

// checkEffective checks an account event's effective time against its record
// time and the account's effective opening (the fold after the event).
func (f *Fold) checkEffective(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, payload any) {
	if m.EffectiveAt == nil {
		return
	}
	eff := *m.EffectiveAt
	if eff.After(m.At.Add(domain.MaxEffectiveSkew)) {
		f.eventViolation(InvEffective, "effective_after_record", re, "effective %s is more than %s after the record time %s",
			eff.Format(time.RFC3339Nano), domain.MaxEffectiveSkew, m.At.Format(time.RFC3339Nano))
	}
	if _, opens := payload.(*domain.AccountOpened); !opens && domain.BeforeOpening(eff, a.EffectiveFrom) {
		f.eventViolation(InvEffective, "effective_before_opening", re, "effective %s, before the effective opening %s of %s",
			eff.Format(time.RFC3339Nano), a.EffectiveFrom.Format(time.RFC3339Nano), a.ID)
	}
}

// accountBalances is what the balances read model should answer by effective
// time at the end of time: each opened account's balance and held amount.
func (f *Fold) accountBalances(account string) map[string][2]int64 {
	out := make(map[string][2]int64, len(f.Accounts))
	for id, a := range f.Accounts {
		if a.Opened && (account == "" || id == account) {
			out[id] = [2]int64{a.Balance, a.Held}
		}
	}
	return out
}

// checkEffectiveBalances compares what a read model answers by effective time
// at the end of time with want, the fold's balances as of its checkpoint
// (accountBalances), in the audit's read-model snapshot tx: the balance
// history's (what query.balance with effective_at reads: balance and held)
// and the statement's (the sum of each account's entries: balance; an
// account without entries has none).
func (f *Fold) checkEffectiveBalances(ctx context.Context, tx pgx.Tx, l liveGen, account string, want map[string][2]int64) error {
	found, err := f.effectiveMismatches(ctx, tx, l, account, want)
	f.reportEffective(l, found, 0)
	return err
}

// effectiveFound is an account whose balance by effective time at the end
// of time, as a read model answers it (got), is not want, its balance by
// record time (known: an account of the fold's or the accounts read
// model's).
type effectiveFound struct {
	id, got string
	want    [2]int64
	known   bool
}

// reportEffective names each account found (effectiveMismatch), in account
// order, as the report lists accounts (found comes partly from the fold's
// accounts, a map), and counts unlisted more found but not read (past
// --max-violations: untouchedFound).
func (f *Fold) reportEffective(l liveGen, found []effectiveFound, unlisted int) {
	slices.SortFunc(found, func(a, b effectiveFound) int { return strings.Compare(a.id, b.id) })
	for _, m := range found {
		f.effectiveMismatch(l, m.id, m.got, m.want, m.known)
	}
	f.violations += unlisted // found past the limit: counted, as violate counts those it does not keep
}

// effectiveMismatches is what checkEffectiveBalances finds, read in q (the
// audit's read-model snapshot or a transaction of it): it changes nothing
// of the fold, so it may run beside the comparisons (sideReads).
func (f *Fold) effectiveMismatches(ctx context.Context, q projections.Querier, l liveGen, account string, want map[string][2]int64) ([]effectiveFound, error) {
	read, readAfter, held := projections.EffectiveBalances, projections.EffectiveBalancesAfter, true
	if l.name == projections.Entries {
		read, readAfter, held = projections.EffectiveEntrySums, projections.EffectiveEntrySumsAfter, false
	}
	var base map[string]int64        // what the rows before an incremental audit's checkpoint add up to
	if f.incrementalOfAll(account) { // the accounts it read, since the checkpoint
		var after projections.AccountsAfter
		after, base = f.resumed.effectiveSince(!held, want)
		read = func(ctx context.Context, q projections.Querier, _ string, at time.Time, each func(projections.EffectiveBalance) error) error {
			return readAfter(ctx, q, after, at, each)
		}
	}
	seen, found := map[string]bool{}, []effectiveFound(nil)
	err := read(ctx, q, account, projections.EndOfTime, func(b projections.EffectiveBalance) error {
		w, ok := want[b.AccountID]
		seen[b.AccountID] = true
		b.Balance += base[b.AccountID]
		if !held {
			b.Held = w[1]
		}
		if !ok || w != [2]int64{b.Balance, b.Held} {
			found = append(found, effectiveFound{b.AccountID, fmt.Sprintf("balance %d held %d", b.Balance, b.Held), w, ok})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id, w := range want { // per account, as the fold keeps accounts
		if !seen[id] && (held || w[0] != base[id]) {
			found = append(found, effectiveFound{id, "nothing", w, true})
		}
	}
	return found, nil
}

// effectiveMismatch names an account whose balance by effective time at the
// end of time, as read model l answers it (got), is not its balance by
// record time, want.
func (f *Fold) effectiveMismatch(l liveGen, id, got string, want [2]int64, known bool) {
	f.violate(Violation{Invariant: InvEffective, Kind: "effective_balance_mismatch", Stream: domain.AccountStream(id), Message: fmt.Sprintf(
		"by effective time, at the end of time, the %s read model (at %s) gives %s for %s; by record time the fold gives balance %d held %d (an account of the fold: %v)",
		l.name, l.pos, got, id, want[0], want[1], known)})
}

// An incremental audit asks the balances by effective time of the accounts
// its events touched (effectiveSince); an account they did not touch has, at
// the end of time, its balance and held amount at the checkpoint, which the
// accounts read model's row still holds (its digest is compared whole:
// tabledigest.go), and no row since. So for each such account the balance
// history's last row must be at or before the row's revision and hold its
// balance and held amount (the sum of its changes at the end of time is the
// last row's), the statement must hold no entry after that revision, and
// neither may hold rows of an account the accounts read model lacks. One
// statement a history table answers it: a loose scan of the table's key
// backwards takes each account's last row (one index descent an account,
// touched or not: its cost grows with the accounts, not the events), joined
// whole with the accounts read model. It lists every account that breaks
// the rule, touched or not, so that it needs nothing of the fold and runs
// while the fold runs (untouched.go); the accounts the fold read are left
// out after it (untouchedFound). The rows before the checkpoint are
// trusted, as an incremental audit trusts them for every account.

// untouchedEffectiveSQL lists, for the history table %[1]s and the accounts
// table %[2]s, the accounts whose last row (%[3]s: its balance and held
// amount, or zeros; %[4]s: whether it breaks the rule above against the
// account's row) breaks it, and those of %[1]s without an accounts row, in
// account order (byte order, as reportEffective lists them, so that which
// are listed past --max-violations is the same in every run): their ID, the
// last row's revision, balance and held amount (-1, 0, 0 without one), and
// the account's revision, balance and held amount (-1, 0, 0 without a row).
const untouchedEffectiveSQL = `WITH RECURSIVE l AS (
	(SELECT account_id, revision, %[3]s FROM %[1]s ORDER BY account_id DESC, revision DESC LIMIT 1)
	UNION ALL
	SELECT n.* FROM l CROSS JOIN LATERAL (SELECT h.account_id, h.revision, %[3]s FROM %[1]s h
		WHERE h.account_id < l.account_id ORDER BY h.account_id DESC, h.revision DESC LIMIT 1) n)
SELECT coalesce(a.account_id, l.account_id), coalesce(l.revision, -1), coalesce(l.balance, 0), coalesce(l.held, 0),
	coalesce(a.revision, -1), coalesce(a.balance, 0), coalesce(a.held, 0)
FROM l FULL JOIN %[2]s a ON a.account_id = l.account_id
WHERE a.account_id IS NULL OR l.revision > a.revision OR %[4]s
ORDER BY coalesce(a.account_id, l.account_id) COLLATE "C"`

// untouchedBroken lists, in account order, every account whose rows of
// read model l (the balance history or the statement) break invariant 9's
// rule for an account no event after the checkpoint touched, read in q. It
// changes nothing of the fold and needs nothing of it, so it runs while the
// fold runs (untouched.go); untouchedFound keeps the accounts not touched.
// What it lists grows with the accounts found, never with the events.
func untouchedBroken(ctx context.Context, q projections.Querier, l liveGen) ([]effectiveFound, error) {
	cols, broken := "balance, held", "l.revision IS NULL OR l.balance <> a.balance OR l.held <> a.held"
	table := projections.View("balance_history")
	if l.name == projections.Entries {
		cols, broken, table = "0::bigint AS balance, 0::bigint AS held", "false", projections.View("entries")
	}
	sql := fmt.Sprintf(untouchedEffectiveSQL, table, projections.View("accounts"), cols, broken)
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("audit: %s of the accounts not touched: %w", l.name, err)
	}
	var (
		found             []effectiveFound
		id                string
		rev, bal, held    int64
		aRev, aBal, aHeld int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &rev, &bal, &held, &aRev, &aBal, &aHeld}, func() error {
		got := fmt.Sprintf("its last row at revision %d (balance %d held %d), the account's row at revision %d", rev, bal, held, aRev)
		found = append(found, effectiveFound{id, got, [2]int64{aBal, aHeld}, aRev >= 0})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: %s of the accounts not touched: %w", l.name, err)
	}
	return found, nil
}

// untouchedFound keeps, of broken (untouchedBroken's, in account order), the
// accounts not touched (those an incremental audit did not read): the first
// limit, and how many more (counted, not listed: the report counts every
// violation).
func untouchedFound(broken []effectiveFound, touched func(id string) bool, limit int) ([]effectiveFound, int) {
	var found []effectiveFound
	unlisted := 0
	for _, b := range broken {
		switch {
		case touched(b.id):
		case len(found) < limit:
			found = append(found, b)
		default:
			unlisted++
		}
	}
	return found, unlisted
}
