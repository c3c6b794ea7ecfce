package audit

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// Over-refunds of transactions (invariant 3). A refund of a posted
// transaction is a transaction of its own in the original's next refund
// slot (domain.RefundTransactionID), and the ledger posts it only within
// what domain.TransactionRefundable leaves of the original once the slots
// before it refunded (domain.SlotRefunded), and posts the original's
// postings reversed (domain.RefundOfTransaction), so the fold checks each
// refund slot's posted outcome against the same bound and the same reversal
// (domain.RefundReversal of the slot's sum): the original's outcome read from
// its stream (its last event, as the ledger reads it: a posted
// post_transaction, else no original), the slots before it read the same
// way unless the check kept what they refunded (txRefundWindow: the last
// txRefundsKept originals refunded, so a transaction's refunds in turn read
// nothing but the original's outcome once).

// txRefundsKept bounds the transactions whose refunds the check keeps: each
// an original's postings (1 to 64) and what its slots refunded.
const txRefundsKept = 256

// txRefunded is what the check knows of one refunded transaction: its
// outcome when it is a posted post_transaction (nil: none), and what its
// refund slots before next refunded.
type txRefunded struct {
	posted   *domain.TransactionPosted
	next     int
	refunded int64
}

// txRefundWindow is the refunded transactions kept, by ID, the first kept
// forgotten first.
type txRefundWindow struct {
	kept  map[string]*txRefunded
	order []string
}

// put keeps r as original's, forgetting the first kept when full.
func (w *txRefundWindow) put(original string, r *txRefunded) {
	if w.kept == nil {
		w.kept = map[string]*txRefunded{}
	}
	if _, ok := w.kept[original]; !ok {
		if len(w.order) == txRefundsKept {
			delete(w.kept, w.order[0])
			w.order = append(w.order[:0], w.order[1:]...)
		}
		w.order = append(w.order, original)
	}
	w.kept[original] = r
}

// checkTransactionRefund checks a transaction stream's outcome re (payload
// decoded) when it is a refund slot's posted transaction: that it refunds a
// posted transaction, no more than is left of it, and reverses it.
func (f *Fold) checkTransactionRefund(re eventstore.RecordedEvent, payload any) {
	refund, posted := payload.(*domain.TransactionPosted)
	original, slot, isRefund := domain.RefundSlotOf(strings.TrimPrefix(re.Stream, domain.TransactionStreamPrefix))
	if f.originals == nil || f.originals.stream == nil || !posted || !isRefund {
		return
	}
	r, err := f.originals.txRefundsBefore(original, slot)
	switch {
	case err != nil:
		f.reloadErr = cmp.Or(f.reloadErr, fmt.Errorf("audit: the original of the refund %s@%d: %w", re.Stream, re.Revision, err))
		return
	case r.posted == nil:
		f.eventViolation(InvBalance, "refund_without_original", re, "a refund of transaction %q, which was not posted", original)
	case refund.Total() > domain.TransactionRefundable(r.posted, r.refunded):
		f.eventViolation(InvBalance, "refund_exceeds_original", re, "refund slot %d of transaction %q refunds %d, more than the %d its slots before left of %d",
			slot, original, refund.Total(), domain.TransactionRefundable(r.posted, r.refunded), r.posted.Total())
	default:
		f.checkReversal(re, original, slot, r, refund)
	}
	r.next, r.refunded = slot+1, r.refunded+domain.SlotRefunded(refund)
}

// checkReversal checks that refund slot slot of transaction original (r what
// is known of it before the slot) posts what the ledger writes there, the
// original's postings reversed (domain.RefundReversal of the slot's sum):
// else refund_not_reversal, naming the first posting that differs and what
// the original had.
func (f *Fold) checkReversal(re eventstore.RecordedEvent, original string, slot int, r *txRefunded, refund *domain.TransactionPosted) {
	want, rej := domain.RefundReversal(r.posted, refund.Total(), r.refunded)
	if rej != nil {
		f.eventViolation(InvBalance, "refund_not_reversal", re, "refund slot %d of transaction %q posts %v, which the ledger does not write: %s", slot, original, refund.Postings, rej.Message)
		return
	}
	i := 0
	for i < len(want) && i < len(refund.Postings) && want[i] == refund.Postings[i] {
		i++
	}
	switch {
	case i < len(want):
		f.eventViolation(InvBalance, "refund_not_reversal", re, "refund slot %d of transaction %q: its posting %d is %s where the ledger writes %s, the reversal of the original's posting %d (%s)",
			slot, original, i, postingText(refund.Postings, i), postingText(want, i), len(want)-1-i, postingText(r.posted.Postings, len(want)-1-i))
	case i < len(refund.Postings):
		f.eventViolation(InvBalance, "refund_not_reversal", re, "refund slot %d of transaction %q: its posting %d is %s, past the %d reversing the original's %v",
			slot, original, i, postingText(refund.Postings, i), len(want), r.posted.Postings)
	}
}

// postingText is posting i of ps as a violation names it ("none" past its
// end).
func postingText(ps []domain.Posting, i int) string {
	if i >= len(ps) {
		return "none"
	}
	return fmt.Sprintf("%s->%s %d %s", ps[i].From, ps[i].To, ps[i].Amount, ps[i].Currency)
}

// txRefundsBefore is what is known of transaction original before its refund
// slot slot: kept, the slots after the last kept read; else the original's
// outcome and every slot before read, then kept.
func (o *originals) txRefundsBefore(original string, slot int) (*txRefunded, error) {
	r := o.txRefunds.kept[original]
	if r == nil || r.next > slot {
		r = &txRefunded{}
		out, command, err := o.txOutcome(original)
		if err != nil {
			return nil, err
		}
		if p, ok := out.(*domain.TransactionPosted); ok && command == string(domain.CmdPostTransaction) {
			r.posted = &domain.TransactionPosted{TransactionID: p.TransactionID, Postings: p.Postings}
		}
	}
	for ; r.next < slot; r.next++ {
		out, _, err := o.txOutcome(domain.RefundTransactionID(original, r.next))
		if err != nil {
			return nil, err
		}
		r.refunded += domain.SlotRefunded(out)
	}
	o.txRefunds.put(original, r)
	return r, nil
}

// txOutcome is transaction id's outcome read from its stream (its last
// event: TransactionPosted or TransactionRejected, else nil: no stream, or no
// outcome yet) and the command it was decided for.
func (o *originals) txOutcome(id string) (payload any, command string, err error) {
	evs, err := o.stream.ReadStream(o.ctx, domain.TransactionStream(id), eventstore.EndOfStream, eventstore.Backwards, 1)
	if errors.Is(err, eventstore.ErrStreamNotFound) || (err == nil && len(evs) == 0) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	e := evs[0]
	if e.Type != domain.EvTransactionPosted && e.Type != domain.EvTransactionRejected {
		return nil, "", nil
	}
	m, err := domain.DecodeMetadataNoRequest(e.Metadata)
	if err != nil {
		return nil, "", err
	}
	payload, err = domain.DecodeEvent(e.Type, e.Data)
	return payload, m.Command, err
}
