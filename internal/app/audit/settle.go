package audit

import (
	"cmp"
	"strings"

	"github.com/ledgerworks/ledger/domain"
)

// A fold with a Reload forgets what it settled: each transfer stream whose
// sagas are all decided (its sagas checked then, as Finish would), each
// transaction stream with its outcome, and each transaction's or capture's leg
// sums once they balance and match its postings. It settles them only once the
// append that last touched them has been folded whole (a later commit has
// been seen), so that no part of one write is judged without the others. A
// later event of a forgotten stream (a refund) has the stream read again from
// the store and folded without checking it again. So the fold's memory grows
// with the sagas in flight, not with every transfer and transaction.

// settles reports whether a stream is one the fold forgets once settled.
func settles(stream string) bool {
	return strings.HasPrefix(stream, domain.TransferStreamPrefix) || domain.IsTransactionStream(stream)
}

// touch notes that an event of the current append touched a settling stream.
func (f *Fold) touch(stream string) {
	if f.Reload != nil {
		f.touched[stream] = f.Last.Commit
	}
}

// touchLegs notes that the current append moved a leg of a transaction or capture.
func (f *Fold) touchLegs(k [2]string) {
	if f.Reload != nil {
		f.legTouched[k] = f.Last.Commit
	}
}

// Settle forgets what the appends folded whole have settled (see above). Run
// calls it after each page of events.
func (f *Fold) Settle() {
	f.settleBefore(f.Last.Commit)
}

// settleAtHead forgets what every append folded has settled, the last one's
// too: Run calls it once the fold has read the store's head, where the last
// append is whole (the head is its last event: on PostgreSQL the last event
// below the xmin horizon, "all" being ordered by transaction id, so no later
// append can land at or below it; KurrentDB's last event), so that
// a checkpoint stored then carries none of the last append's decided
// streams for the next audit to read again.
func (f *Fold) settleAtHead() {
	f.settleBefore(f.Last.Commit + 1)
}

// settleBefore forgets what the appends before commit settled.
func (f *Fold) settleBefore(commit uint64) {
	if f.Reload == nil {
		return
	}
	for k, at := range f.legTouched {
		if at >= commit {
			continue
		}
		delete(f.legTouched, k)
		if l, p := f.legs[k], f.posted[k]; l != nil && p != nil && l.debits == l.credits && *l == *p {
			delete(f.legs, k)
			delete(f.posted, k)
		}
	}
	for stream, at := range f.touched {
		if at >= commit {
			continue
		}
		delete(f.touched, stream)
		if !f.badStream[stream] {
			f.settleStream(stream)
		}
	}
}

func (f *Fold) settleStream(stream string) {
	if id, ok := strings.CutPrefix(stream, domain.TransferStreamPrefix); ok {
		t := f.Transfers[id]
		if t == nil || !transferDecided(t) {
			return
		}
		f.checkTransfer(id, t, nil)
		for _, s := range transferSagas(t) {
			delete(f.steps, s.Key)
			delete(f.checkedSagas, s.Key)
		}
		delete(f.Transfers, id)
		delete(f.streams, stream)
		f.settledTransfers++
		return
	}
	if ts := f.txSagas[stream]; ts != nil && ts.Decided() {
		delete(f.txSagas, stream)
		delete(f.streams, stream)
		f.settledTx++
	}
}

// transferDecided reports whether every saga of a transfer is decided.
func transferDecided(t *domain.Transfer) bool {
	for _, s := range transferSagas(t) {
		if !s.Stage.Decided() {
			return false
		}
	}
	return t.Saga != nil
}

// transferSagas lists a transfer's own saga and its refunds'.
func transferSagas(t *domain.Transfer) []*domain.Saga {
	var out []*domain.Saga
	if t.Saga != nil {
		out = append(out, t.Saga)
	}
	for _, k := range t.RefundOrder {
		out = append(out, t.Refunds[k])
	}
	return out
}

// checkTransfer checks a transfer's sagas not checked before it was forgotten,
// noting each saga's key in sagas (when set).
func (f *Fold) checkTransfer(id string, t *domain.Transfer, sagas map[string]bool) {
	for _, s := range transferSagas(t) {
		if sagas != nil {
			sagas[s.Key] = true
		}
		if !f.checkedSagas[s.Key] {
			f.checkSaga(id, s)
		}
	}
}

// reload reads a forgotten stream's events before revision rev from the store
// and folds them again without checking them (they were), restoring what the
// fold kept of it. A stream the store does not hold whole before rev is left
// to the revision check, which names the gap.
func (f *Fold) reload(stream string, rev uint64) *streamState {
	recs, err := f.Reload(stream, rev)
	if err != nil {
		f.reloadErr = cmp.Or(f.reloadErr, err)
		return nil
	}
	if uint64(len(recs)) != rev {
		return nil
	}
	ss := &streamState{}
	id, transfer := strings.CutPrefix(stream, domain.TransferStreamPrefix)
	t, ts := domain.NewTransfer(id), domain.NewTransactionSaga(strings.TrimPrefix(stream, domain.TransactionStreamPrefix))
	for i, re := range recs {
		m, err := domain.DecodeMetadataNoRequest(re.Metadata)
		if err != nil || re.Revision != uint64(i) {
			return nil
		}
		ev := storedEvent(re, m)
		if transfer {
			err = domain.EvolveTransfer(t, ev)
		} else {
			err = domain.EvolveTransactionSaga(ts, ev)
		}
		if err != nil {
			return nil
		}
		ss.next, ss.chain = re.Revision+1, m.Chain
		if m.Index == 0 {
			ss.groupKey, ss.groupNext, ss.groupCount = m.Key, 1, m.Count
		} else {
			ss.groupKey, ss.groupNext = m.Key, m.Index+1
		}
	}
	if transfer {
		f.Transfers[id] = t
		f.settledTransfers--
		for _, s := range transferSagas(t) {
			if s.Stage.Decided() {
				f.checkedSagas[s.Key] = true
			}
		}
	} else {
		ownOutcome(ts) // the reload's page, as applyTransaction's
		f.txSagas[stream] = ts
		f.settledTx--
	}
	f.streams[stream] = ss
	return ss
}
