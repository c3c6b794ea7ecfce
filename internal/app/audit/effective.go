package audit

import (
	"context"
	"fmt"
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
	if _, opens := payload.(*domain.AccountOpened); !opens && eff.Before(a.EffectiveFrom) {
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
	read, readAfter, held := projections.EffectiveBalances, projections.EffectiveBalancesAfter, true
	if l.name == projections.Entries {
		read, readAfter, held = projections.EffectiveEntrySums, projections.EffectiveEntrySumsAfter, false
	}
	var base map[string]int64              // what the rows before an incremental audit's checkpoint add up to
	if f.resumed != nil && account == "" { // the accounts it read, since the checkpoint
		var after projections.AccountsAfter
		after, base = f.resumed.effectiveSince(!held, want)
		read = func(ctx context.Context, q projections.Querier, _ string, at time.Time, each func(projections.EffectiveBalance) error) error {
			return readAfter(ctx, q, after, at, each)
		}
	}
	seen := map[string]bool{}
	err := read(ctx, tx, account, projections.EndOfTime, func(b projections.EffectiveBalance) error {
		w, ok := want[b.AccountID]
		seen[b.AccountID] = true
		b.Balance += base[b.AccountID]
		if !held {
			b.Held = w[1]
		}
		if !ok || w != [2]int64{b.Balance, b.Held} {
			f.effectiveMismatch(l, b.AccountID, fmt.Sprintf("balance %d held %d", b.Balance, b.Held), w, ok)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id, w := range want { // per account, as the fold keeps accounts
		if !seen[id] && (held || w[0] != base[id]) {
			f.effectiveMismatch(l, id, "nothing", w, true)
		}
	}
	return nil
}

// effectiveMismatch names an account whose balance by effective time at the
// end of time, as read model l answers it (got), is not its balance by
// record time, want.
func (f *Fold) effectiveMismatch(l liveGen, id, got string, want [2]int64, known bool) {
	f.violate(Violation{Invariant: InvEffective, Kind: "effective_balance_mismatch", Stream: domain.AccountStream(id), Message: fmt.Sprintf(
		"by effective time, at the end of time, the %s read model (at %s) gives %s for %s; by record time the fold gives balance %d held %d (an account of the fold: %v)",
		l.name, l.pos, got, id, want[0], want[1], known)})
}
