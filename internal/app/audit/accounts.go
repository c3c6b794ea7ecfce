package audit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// resumedAccounts are the accounts of the checkpoint an incremental audit
// resumed from (readmodel.audit_checkpoint_accounts): read into the fold only
// as its events touch them (prefetch, a query a page), so that what the audit
// pays for them grows with the accounts touched, not with every account.
type resumedAccounts struct {
	q      projections.Querier
	id     int64 // the checkpoint's
	rows   int64 // its account rows
	loaded int64 // of them read into the fold
	// untouched sums the open accounts not read, per currency (Balances
	// and Accounts of a Totals): the whole ledger's sums at the checkpoint
	// less each account read.
	untouched map[string]*Totals
	// at is each account read as the checkpoint has it: its revision and
	// balance (effectiveSince).
	at map[string][2]int64
	// old is each open account read, as the accounts read model's row should
	// have held it at the checkpoint (checkAccountsTable).
	old map[string]accountCols
	// oldHolds is each active hold of the accounts read, by account/hold, as
	// the holds table should have held it at the checkpoint (checkHoldsTable).
	oldHolds map[string]holdCols
}

func newResumedAccounts(q projections.Querier, id int64, c carried) *resumedAccounts {
	r := &resumedAccounts{q: q, id: id, rows: c.AccountRows, untouched: map[string]*Totals{}, at: map[string][2]int64{}, old: map[string]accountCols{}, oldHolds: map[string]holdCols{}}
	for _, t := range c.Balances {
		r.untouched[t.Currency] = &Totals{Currency: t.Currency, Balances: t.Balances, Accounts: t.Accounts}
	}
	return r
}

// prefetch reads, before the fold applies a page, the checkpoint's rows of
// the accounts the page touches that the fold does not hold yet.
func (f *Fold) prefetch(ctx context.Context, recs []eventstore.RecordedEvent) error {
	if f.resumed == nil {
		return nil
	}
	var ids []string
	asked := map[string]bool{}
	for _, re := range recs {
		id, ok := strings.CutPrefix(re.Stream, domain.AccountStreamPrefix)
		if ok && !asked[id] && f.streams[re.Stream] == nil {
			asked[id] = true
			ids = append(ids, id)
		}
	}
	return f.loadAccounts(ctx, ids, false)
}

// loadAccounts reads into the fold the checkpoint's rows of the accounts
// named (those it holds) and, when guarded, of every account with a capture
// in flight. A row whose state does not decode (edited since: its hash) is
// refused, as a checkpoint that does not match.
func (f *Fold) loadAccounts(ctx context.Context, ids []string, guarded bool) error {
	r := f.resumed
	if r == nil || (len(ids) == 0 && !guarded) {
		return nil
	}
	return projections.Checkpoints.LoadAuditAccounts(ctx, r.q, r.id, ids, guarded, func(row projections.AuditAccount) error {
		stream := domain.AccountStream(row.AccountID)
		if f.streams[stream] != nil {
			return nil // read already
		}
		a, ss, err := rowAccount(stream, row)
		if err != nil {
			return fmt.Errorf("audit: checkpoint %d: %w: run a full audit (without --from) to store a new checkpoint", r.id, err)
		}
		f.Accounts[a.ID] = a
		f.streams[stream] = ss
		if row.Checked.Recorded() {
			f.recordResumed(stream, row.Checked)
		}
		r.loaded++
		r.at[a.ID] = [2]int64{a.Revision, a.Balance}
		r.noteOldHolds(a)
		if a.Opened {
			r.old[a.ID] = accountColsOf(a)
			t := r.untouched[a.Currency]
			if t == nil || t.Accounts == 0 {
				return fmt.Errorf("audit: checkpoint %d: account %s is open in %s, which its sums do not count: it was edited since; run a full audit", r.id, a.ID, a.Currency)
			}
			t.Balances -= a.Balance
			t.Accounts--
		}
		return nil
	})
}

// rowAccount is an account and its stream's state as a checkpoint row holds
// them, bounded as the fold keeps them (boundAccount, restoreClosedHold).
func rowAccount(stream string, row projections.AuditAccount) (*domain.Account, *streamState, error) {
	a, err := domain.DecodeSnapshot(stream, row.Snapshot)
	if err != nil {
		return nil, nil, err
	}
	boundAccount(a)
	ss := &streamState{next: row.Next, chain: row.Chain, groupKey: row.GroupKey, groupNext: row.GroupNext, groupCount: row.GroupCount, refunds: refundsTotalOfRow(row.RefundsTotal)}
	restoreClosedHold(a, ss)
	return a, ss, nil
}

// addUntouched adds the open accounts the fold did not read to the totals
// (finishConservation).
func (r *resumedAccounts) addUntouched(f *Fold) {
	if r == nil {
		return
	}
	for cur, u := range r.untouched {
		if u.Accounts > 0 || u.Balances != 0 {
			t := f.totals(cur)
			t.Balances += u.Balances
			t.Accounts += u.Accounts
		}
	}
}

// accountRows is how many accounts the ledger has: the fold's and the
// checkpoint's it did not read.
func (f *Fold) accountRows() int64 {
	n := int64(len(f.Accounts))
	if r := f.resumed; r != nil {
		n += r.rows - r.loaded
	}
	return n
}

// carriedBalances sums the open accounts' balances per currency, the fold's
// and the checkpoint's it did not read.
func (f *Fold) carriedBalances() []Totals {
	sums := map[string]*Totals{}
	add := func(cur string, balance int64, accounts int) {
		t := sums[cur]
		if t == nil {
			t = &Totals{Currency: cur}
			sums[cur] = t
		}
		t.Balances += balance
		t.Accounts += accounts
	}
	if r := f.resumed; r != nil {
		for cur, u := range r.untouched {
			add(cur, u.Balances, u.Accounts)
		}
	}
	for _, a := range f.Accounts {
		if a.Opened {
			add(a.Currency, a.Balance, 1)
		}
	}
	out := make([]Totals, 0, len(sums))
	for _, cur := range slices.Sorted(maps.Keys(sums)) {
		out = append(out, *sums[cur])
	}
	return out
}

// accountRowsOut hands the fold's accounts as checkpoint rows, one at a time
// (each encoded as it is written: COPY's source).
func (f *Fold) accountRowsOut() func() (projections.AuditAccount, bool, error) {
	ids := slices.Collect(maps.Keys(f.Accounts))
	return func() (projections.AuditAccount, bool, error) {
		if len(ids) == 0 {
			return projections.AuditAccount{}, false, nil
		}
		id := ids[0]
		ids = ids[1:]
		a, stream := f.Accounts[id], domain.AccountStream(id)
		ss := f.streams[stream]
		snap, err := accountSnapshot(stream, a, ss)
		if err != nil {
			return projections.AuditAccount{}, false, fmt.Errorf("audit: checkpoint: %w", err)
		}
		row := projections.AuditAccount{AccountID: id, Guarded: captureInFlight(a), Snapshot: snap, Checked: f.checked[stream]}
		if ss != nil {
			row.Next, row.Chain, row.GroupKey, row.GroupNext, row.GroupCount = ss.next, ss.chain, ss.groupKey, ss.groupNext, ss.groupCount
			row.RefundsTotal = ss.refunds.row()
		}
		return row, true, nil
	}
}

// accountSnapshot encodes an account for its checkpoint row with its last
// closed hold, which the fold keeps as its ID, status and digest
// (forgetClosedHold), as a stub of them (holdStub): what an audit resumed
// from the row needs of it (restoreClosedHold). Rows stored by 017808d and
// before carry the whole hold, which restoreClosedHold reads alike.
func accountSnapshot(stream string, a *domain.Account, ss *streamState) ([]byte, error) {
	if ss == nil || ss.closedHold == "" || a.Holds[ss.closedHold] != nil {
		return domain.EncodeSnapshot(stream, a)
	}
	defer lendHold(a, holdStub(ss))()
	return domain.EncodeSnapshot(stream, a)
}

// restoreClosedHold moves an account's closed holds, read from a checkpoint
// row, into its stream state as the fold keeps them (forgetClosedHold): the
// last one (lastClosedInRow) as its ID, status and digest, the others
// dropped. A stub without a digest (c4c1c2f's) is dropped too.
func restoreClosedHold(a *domain.Account, ss *streamState) {
	last := lastClosedInRow(a)
	for _, id := range slices.Sorted(maps.Keys(a.Holds)) {
		if h := a.Holds[id]; h.Status != domain.HoldStatusActive && h != last {
			a.ForgetClosedHold(id, true)
		}
	}
	if last == nil {
		return
	}
	d, ok := digestHold(last), true
	if isStub(last) {
		d, ok = stubDigest(last)
	}
	if ok {
		ss.closedHold, ss.closedStatus, ss.closedDigest, ss.closedFindable = last.ID, last.Status, d, last.Findable
	}
	a.ForgetClosedHold(last.ID, !ok)
}

// lastClosedInRow is the last closed hold of an account read from a
// checkpoint row. A row written by this build carries at most one, a stub;
// one written by 017808d (boundAccount's HoldLimit) or resumed by it from
// this build's row keeps its stub beside the whole hold it closed after: a
// whole hold is later than a stub. Of two alike (which no build writes), the
// greater ID, so that the choice never depends on a map's order.
func lastClosedInRow(a *domain.Account) *domain.Hold {
	var last *domain.Hold
	for _, h := range a.Holds {
		if h.Status == domain.HoldStatusActive {
			continue
		}
		if last == nil || (isStub(last) && !isStub(h)) || (isStub(last) == isStub(h) && h.ID > last.ID) {
			last = h
		}
	}
	return last
}

// captureInFlight reports whether a capture saga guards one of the account's
// active holds (finishTransactions counts it wherever the events are).
func captureInFlight(a *domain.Account) bool {
	for id, h := range a.Holds {
		if _, ok := domain.CaptureGuardKey(id); ok && h.Status == domain.HoldStatusActive {
			return true
		}
	}
	return false
}

// resumedKeys are the rows of a table an incremental audit compares beside
// those its sets noted: the accounts' rows of the accounts the fold read (nil:
// every row, for a fold from the start).
func (f *Fold) resumedKeys(table string) []string {
	if f.resumed == nil || table != "accounts" {
		return nil
	}
	return append([]string{}, slices.Collect(maps.Keys(f.Accounts))...)
}

// effectiveSince narrows an incremental audit's check of the balances by
// effective time (invariant 9) to the accounts of want, over their rows
// since the checkpoint: the balance history's from each account's last row
// at the checkpoint on (whose sums of changes are the last row's, as over
// every row), the entries after it, whose sum is the account's balance less
// its balance at the checkpoint (base: that balance, to add). An account the
// checkpoint does not hold is read whole.
func (r *resumedAccounts) effectiveSince(entries bool, want map[string][2]int64) (projections.AccountsAfter, map[string]int64) {
	after := projections.AccountsAfter{IDs: make([]string, 0, len(want)), Revisions: make([]int64, 0, len(want))}
	base := map[string]int64{}
	for id := range want {
		cp, ok := r.at[id]
		if !ok {
			cp = [2]int64{-1, 0}
		}
		rev := cp[0] - 1 // the checkpoint's last row and after
		if entries {
			rev, base[id] = cp[0], cp[1]
		}
		after.IDs, after.Revisions = append(after.IDs, id), append(after.Revisions, max(rev, -1))
	}
	return after, base
}
