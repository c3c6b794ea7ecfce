package domain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Transactions (PROTOCOL.md v1.1 §2.1). A transaction stream
// (TransactionStream) holds one event, written under the client's key together
// with every account's legs and the key's claim, in one atomic append:
//
//	TransactionPosted      the postings, every leg's event and every touched account after it
//	TransactionRejected    the refusing posting's code and index, the accounts as they were
//
// The legs are Debited and Credited events in the account streams, under the
// derived key LegKey(key, account), with reason transaction_out or
// transaction_in and the transaction's ID as their ref. A transaction is posted
// only where the store writes several streams at once (PostgreSQL, memory).

// Event types of transaction streams.
const (
	EvTransactionPosted   = "TransactionPosted"
	EvTransactionRejected = "TransactionRejected"
)

// TransactionStreamPrefix starts the stream of every transaction.
const TransactionStreamPrefix = "transaction-"

// TransactionStream is the stream of a transaction.
func TransactionStream(id string) string { return TransactionStreamPrefix + id }

// StepLeg derives the key of a transaction's legs in one account (LegKey).
const StepLeg = "leg"

// LegKey is the key of a transaction's legs in one account: derived from the
// transaction's key and the account, so that each key's events lie in one stream.
func LegKey(key, accountID string) string { return StepKey(key, StepLeg+":"+accountID) }

// Reasons of a transaction's legs.
const (
	ReasonTransactionOut = "transaction_out"
	ReasonTransactionIn  = "transaction_in"
)

// Transaction statuses (the reply's transaction.status).
const (
	TransactionPostedStatus   = "posted"
	TransactionRejectedStatus = "rejected"
)

// TransactionPosted records a posted transaction: its postings, the events of
// its legs in the account streams, and every account it touched as the
// transaction left it (ordered by account ID), so that its reply is rebuilt
// from this event alone.
type TransactionPosted struct {
	TransactionID string            `json:"transaction_id"`
	Postings      []Posting         `json:"postings"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Legs          []EventRef        `json:"legs"`
	Accounts      []AccountView     `json:"accounts"`
}

// TransactionRejected records a refused transaction: the refusing posting, its
// code, and the accounts as they were (nothing moved).
type TransactionRejected struct {
	TransactionID string            `json:"transaction_id"`
	Postings      []Posting         `json:"postings"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Code          Code              `json:"code"`
	Message       string            `json:"message"`
	Posting       int               `json:"posting"`
	Accounts      []AccountView     `json:"accounts"`
}

func (e *TransactionPosted) foldTransaction(ts *TransactionSaga, ev StoredEvent) error {
	ts.setOutcome(ev)
	return nil
}

func (e *TransactionRejected) foldTransaction(ts *TransactionSaga, ev StoredEvent) error {
	ts.setOutcome(ev)
	return nil
}

// TransactionAccounts lists the accounts a transaction's postings touch, sorted.
func TransactionAccounts(ps []Posting) []string {
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.From, p.To)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// TransactionDecision is what DecideTransaction concluded: the transaction
// stream's event (posted, or a recorded rejection), each account's leg events
// (none when rejected), or a rejection not recorded (an account that does not
// exist) with the posting that named it.
type TransactionDecision struct {
	Event     NewEvent              // the transaction stream's one event; zero when not recorded
	Legs      map[string][]NewEvent // by account ID
	Rejection *Rejection
	Posting   int // the refusing posting's index, when Rejection is set
	// Invalid: the transaction's effective_at is refused on one of its
	// accounts (Account.CheckEffective); nothing is recorded.
	Invalid *InvalidError
}

// DecideTransaction decides cmd (post_transaction, key set) against the
// accounts its postings touch (by ID: every one of TransactionAccounts, an
// unopened one as NewAccount gives it), applying the postings in order, each on
// the balances the ones before it left, as transfers are allowed. Accounts are
// not changed: the legs are folded once written.
func DecideTransaction(accounts map[string]*Account, cmd Command) TransactionDecision {
	scratch := map[string]*Account{}
	for id, a := range accounts {
		c := *a // balances change below; nothing the decisions read is shared
		scratch[id] = &c
	}
	legs := map[string][]NewEvent{}
	views := func() []AccountView {
		out := make([]AccountView, 0, len(scratch))
		for _, id := range TransactionAccounts(cmd.Postings) {
			a := scratch[id]
			v := a.View()
			v.Revision = uint64(a.Revision + int64(len(legs[id])))
			out = append(out, v)
		}
		return out
	}
	refuse := func(i int, r *Rejection) TransactionDecision {
		r.Message = fmt.Sprintf("posting %d: %s", i, r.Message)
		legs = map[string][]NewEvent{}
		for id, a := range accounts { // the accounts as they are
			c := *a
			scratch[id] = &c
		}
		d := TransactionDecision{Rejection: r, Posting: i}
		if r.Recorded {
			d.Event = NewEvent{EvTransactionRejected, TransactionRejected{
				TransactionID: cmd.TransactionID, Postings: cmd.Postings, Metadata: cmd.Metadata,
				Code: r.Code, Message: r.Message, Posting: i, Accounts: views(),
			}}
		}
		return d
	}
	if ierr := checkEffectiveOn(accounts, TransactionAccounts(cmd.Postings), cmd); ierr != nil {
		return TransactionDecision{Invalid: ierr}
	}
	for i, p := range cmd.Postings {
		for _, id := range []string{p.From, p.To} {
			if a := scratch[id]; a == nil || !a.Opened {
				return refuse(i, MissingAccount(id))
			}
		}
		from, to := scratch[p.From], scratch[p.To]
		debit := from.decideDebit(cmd, movement{p.Amount, p.Currency, ReasonTransactionOut, cmd.TransactionID})
		if debit.Rejection != nil {
			return refuse(i, debit.Rejection)
		}
		credit := to.decideCredit(cmd, movement{p.Amount, p.Currency, ReasonTransactionIn, cmd.TransactionID}, false)
		if credit.Rejection != nil {
			return refuse(i, credit.Rejection)
		}
		from.Balance = debit.Events[0].Data.(Debited).BalanceAfter
		to.Balance = credit.Events[0].Data.(Credited).BalanceAfter
		legs[p.From] = append(legs[p.From], debit.Events[0])
		legs[p.To] = append(legs[p.To], credit.Events[0])
	}
	posted := TransactionPosted{TransactionID: cmd.TransactionID, Postings: cmd.Postings, Metadata: cmd.Metadata, Accounts: views()}
	for _, id := range TransactionAccounts(cmd.Postings) {
		stream := AccountStream(id)
		for j, ev := range legs[id] {
			posted.Legs = append(posted.Legs, EventRef{
				ID: EventID(LegKey(cmd.IdempotencyKey, id), stream, j), Stream: stream,
				Revision: uint64(accounts[id].Revision + 1 + int64(j)), Type: ev.Type,
			})
		}
	}
	return TransactionDecision{Event: NewEvent{EvTransactionPosted, posted}, Legs: legs}
}

// checkEffectiveOn is Account.CheckEffective over the accounts of ids that
// exist: the first refusal, or nil.
func checkEffectiveOn(accounts map[string]*Account, ids []string, cmd Command) *InvalidError {
	for _, id := range ids {
		if a := accounts[id]; a != nil {
			if ierr := a.CheckEffective(cmd); ierr != nil {
				return ierr
			}
		}
	}
	return nil
}

// TransactionLegCommand is the command under which a transaction's legs are
// written to one account (their metadata): its key derived from the
// transaction's, its origin the transaction's key.
func TransactionLegCommand(tx Command, accountID string) Command {
	return Command{
		Type: CmdTransactionLeg, IdempotencyKey: LegKey(tx.IdempotencyKey, accountID), AccountID: accountID,
		TransactionID: tx.TransactionID, At: tx.At, EffectiveAt: tx.EffectiveAt, Origin: tx.IdempotencyKey, Ref: tx.TransactionID,
	}
}

// StepCaptureTo derives the key of a capture's credit to its `to` account.
const StepCaptureTo = "capture_to"

// CaptureCreditCommand is the command under which a capture's credit is written
// to its `to` account: its key derived from the capture's, its origin the
// capture's key.
func CaptureCreditCommand(capture Command) Command {
	return Command{
		Type: CmdCaptureCredit, IdempotencyKey: StepKey(capture.IdempotencyKey, StepCaptureTo), AccountID: capture.To,
		HoldID: capture.HoldID, At: capture.At, EffectiveAt: capture.EffectiveAt, Origin: capture.IdempotencyKey, Ref: capture.HoldID,
	}
}

// RefundTransactionID names the n-th refund of a transaction: a transaction of
// its own. "~" is not a character of client IDs, so no client transaction
// takes the name.
func RefundTransactionID(txID string, n int) string { return txID + refundInfix + strconv.Itoa(n) }

// ValidTransactionName reports whether id names a transaction: a client's
// transaction ID, or a refund's (RefundTransactionID of one).
func ValidTransactionName(id string) bool {
	if !strings.Contains(id, refundInfix) {
		return ValidID(id)
	}
	orig, _, ok := RefundSlotOf(id)
	return ok && ValidTransactionName(orig)
}

// RefundSlotOf is the inverse of RefundTransactionID: the transaction id
// refunds and its slot n; ok is false for an id that names no refund.
func RefundSlotOf(id string) (original string, n int, ok bool) {
	i := strings.LastIndex(id, refundInfix)
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+len(refundInfix):])
	if err != nil || n < 0 || RefundTransactionID(id[:i], n) != id {
		return "", 0, false
	}
	return id[:i], n, true
}

const refundInfix = "~refund~"

// NextRefundSlot is the stream of the refund slot after the one whose
// transaction stream is stream; ok is false for a stream of no refund slot.
// A refund of a transaction is claimed naming the slot it is about to
// write; on a store that appends one stream a write the claim is written
// first, and an instance that loses the slot to another key decides the
// refund in a later one under that claim: the ledger's lookup and the
// audit's claim check follow such a claim slot after slot, each taken by
// another key.
func NextRefundSlot(stream string) (next string, ok bool) {
	if !IsTransactionStream(stream) {
		return "", false
	}
	orig, n, ok := RefundSlotOf(strings.TrimPrefix(stream, TransactionStreamPrefix))
	if !ok {
		return "", false
	}
	return TransactionStream(RefundTransactionID(orig, n+1)), true
}

// RefundOfTransaction is the transaction that refunds a posted one (the
// refund command cmd, refunded already refunded by earlier refunds): every
// posting reversed, the last first, in full; in part only for a transaction of
// one posting. The refusal, when it may not be refunded so, is not recorded:
// what was refunded only grows, so it stands. The caller names the transaction.
func RefundOfTransaction(orig *TransactionPosted, cmd Command, refunded int64) (Command, *Rejection) {
	left := TransactionRefundable(orig, refunded)
	tx := Command{Type: CmdRefund, IdempotencyKey: cmd.IdempotencyKey, OriginalKey: cmd.OriginalKey, Metadata: cmd.Metadata, At: cmd.At, EffectiveAt: cmd.EffectiveAt}
	switch {
	case cmd.HasAmount && len(orig.Postings) > 1:
		return Command{}, &Rejection{Code: CodeNotRefundable, Message: fmt.Sprintf("transaction %s has %d postings: it is refunded in full, without an amount", orig.TransactionID, len(orig.Postings))}
	case left <= 0 || (cmd.HasAmount && cmd.Amount > left):
		return Command{}, &Rejection{Code: CodeRefundExceedsOriginal, Message: fmt.Sprintf("refund exceeds the %d still refundable of transaction %s", left, orig.TransactionID)}
	}
	for i := len(orig.Postings) - 1; i >= 0; i-- {
		p := orig.Postings[i]
		amount := p.Amount
		if cmd.HasAmount {
			amount = cmd.Amount
		} else if len(orig.Postings) == 1 {
			amount = left
		}
		tx.Postings = append(tx.Postings, Posting{From: p.To, To: p.From, Amount: amount, Currency: p.Currency})
	}
	return tx, nil
}

// RefundReversal is what RefundOfTransaction writes in a refund slot of orig
// that refunds amount once the slots before it refunded refunded: in part
// only for a transaction of one posting (a refund in full of what is left of
// it writes the same), else every posting in full; or its refusal. The audit
// checks a stored slot's postings against it, the slot's Total its amount.
func RefundReversal(orig *TransactionPosted, amount, refunded int64) ([]Posting, *Rejection) {
	cmd := Command{Type: CmdRefund}
	if len(orig.Postings) == 1 {
		cmd.HasAmount, cmd.Amount = true, amount
	}
	tx, rej := RefundOfTransaction(orig, cmd, refunded)
	return tx.Postings, rej
}

// Total is the sum of a posted transaction's postings: what it moved, what
// its refunds together may reach, and what a refund of it (a transaction of
// its own) refunded.
func (e *TransactionPosted) Total() int64 {
	total := int64(0)
	for _, p := range e.Postings {
		total += p.Amount
	}
	return total
}

// SlotRefunded is what a refund slot refunded of its original, its outcome
// (a decoded payload) read: a posted slot's Total, nothing for a refusal
// recorded in it or no outcome. The one home of the sum of the slots before a
// refund, which the ledger decides its next slot by and the audit checks a
// slot against.
func SlotRefunded(outcome any) int64 {
	if p, ok := outcome.(*TransactionPosted); ok {
		return p.Total()
	}
	return 0
}

// TransactionRefundable is what the refunds of the posted transaction orig
// may still reach once its earlier refunds refunded refunded (the Totals of
// its refund slots before): the one bound of a transaction's refunds, which
// RefundOfTransaction decides by and the audit checks stored refunds
// against.
func TransactionRefundable(orig *TransactionPosted, refunded int64) int64 {
	return orig.Total() - refunded
}

// TransactionPayload is a decided transaction event's payload (a value) in the
// pointer form DecodeEvent returns.
func TransactionPayload(v any) any {
	switch e := v.(type) {
	case TransactionPosted:
		return &e
	case TransactionRejected:
		return &e
	}
	return v
}

// IsTransactionStream reports whether a stream is a transaction's.
func IsTransactionStream(stream string) bool {
	return strings.HasPrefix(stream, TransactionStreamPrefix)
}
