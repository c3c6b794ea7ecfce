package domain

import (
	"fmt"
	"time"
)

// Reservation sagas: a transaction on a store that cannot append to several
// streams at once (KurrentDB through its v4 client), with the outcome of
// DecideTransaction: every posting applied, in order, or none (PROTOCOL.md
// §2.1). Its stream (TransactionStream) holds
//
//	TransactionRequested            the request, under the client's key (written with its claim)
//	TransactionReserved             marker: every account's reservation is in place
//	TransactionReservationRefused   marker: a reservation was refused; the refusal the reply gives
//	TransactionPosted | TransactionRejected   the outcome, as one decision writes it
//
// the markers and the outcome under keys derived from the client's (StepKey),
// with the client's key as their origin. Each account step is a command under
// a derived key, so that running it again (a retry, the transfer process after
// a crash) answers the first outcome:
//
//	reserve:<account>   HoldPlaced of ReservationHoldID for the most the postings,
//	                    in order, ever take out of the account (0 for an account
//	                    they only credit), or a recorded refusal
//	leg:<account>       (LegKey, as a one-append transaction's legs) HoldReleased of
//	                    the reservation, then the account's Debited and Credited
//	                    legs in posting order
//	release:<account>   HoldReleased of the reservation, after a refusal
//
// Every account's reservation is placed before any leg is posted, and an
// account with an active hold cannot be closed (it is not empty), so once all
// reservations hold, no leg can be refused: a refused reservation releases the
// others and nothing moves. The outcome is recorded in the stream before the
// steps that follow it (the legs, or the releases), so a recovery never takes
// another path.

// Event types of a reservation saga's stream.
const (
	EvTransactionRequested          = "TransactionRequested"
	EvTransactionReserved           = "TransactionReserved"
	EvTransactionReservationRefused = "TransactionReservationRefused"
)

// Steps of a reservation saga (StepKey).
const (
	StepReserve  = "reserve"
	StepReserved = "reserved"
	StepRefused  = "refused"
	StepRelease  = "release"
	StepPosted   = "posted"
	StepRejected = "rejected"
)

// CmdTransactionReserve is a reservation saga's reservation on one account.
const CmdTransactionReserve CommandType = "transaction_reserve"

// TransactionRequested opens a reservation saga.
type TransactionRequested struct {
	TransactionID string            `json:"transaction_id"`
	Postings      []Posting         `json:"postings"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// TransactionReserved records that every account's reservation is in place:
// the legs follow.
type TransactionReserved struct {
	TransactionID string `json:"transaction_id"`
}

// TransactionReservationRefused records the refusal that decides the
// transaction (the earliest posting refused): the reservations are released.
type TransactionReservationRefused struct {
	TransactionID string `json:"transaction_id"`
	Account       string `json:"account_id"`
	Code          Code   `json:"code"`
	Message       string `json:"message"`
	Posting       int    `json:"posting"`
}

// ReservationHoldID is the hold a transaction's reservation places. "~" is not
// a character of client IDs, so no client hold takes the name.
func ReservationHoldID(txID string) string { return "txn~" + txID }

// TransactionReservation is what a transaction reserves on an account: the
// most its postings, applied in order, ever take out of it (its peak
// cumulative outflow), 0 for an account they only credit.
func TransactionReservation(ps []Posting, account string) int64 {
	var net, peak int64
	for _, p := range ps {
		if p.From == account {
			net += p.Amount
		}
		if p.To == account {
			net -= p.Amount
		}
		peak = max(peak, net)
	}
	return peak
}

// decideTransactionReserve places a transaction's reservation on the account,
// or refuses it as one decision over every account would refuse a posting on
// it: closed, another currency, not enough available within the overdraft.
func (a *Account) decideTransactionReserve(cmd Command) Decision {
	if a.Closed {
		return reject(cmd, CodeAccountClosed, true, "account %s is closed", a.ID)
	}
	for _, p := range cmd.Postings {
		if (p.From == a.ID || p.To == a.ID) && p.Currency != a.Currency {
			return reject(cmd, CodeCurrencyMismatch, true, "account %s holds %s, not %s", a.ID, a.Currency, p.Currency)
		}
	}
	if _, exists := a.Holds[cmd.HoldID]; exists {
		return reject(cmd, CodeHoldExists, true, "hold %s already exists on %s", cmd.HoldID, a.ID)
	}
	amount := TransactionReservation(cmd.Postings, a.ID)
	held, ok := addMinor(a.Held, amount)
	if !ok {
		return reject(cmd, CodeAmountOverflow, true, "held amount of %s would leave the int64 range", a.ID)
	}
	if avail, ok := subMinor(a.Balance, held); !ok || !a.withinOverdraft(avail) {
		return reject(cmd, CodeInsufficientFunds, true, "account %s has %d available, the transaction takes up to %d", a.ID, a.Available(), amount)
	}
	return apply(NewEvent{EvHoldPlaced, HoldPlaced{HoldID: cmd.HoldID, Amount: amount, Currency: a.Currency, HeldAfter: held, BalanceAfter: ptr(a.Balance), Metadata: cmd.Metadata}})
}

// decideReservedLegs posts a transaction's legs on the account its reservation
// holds: the reservation released, then each posting touching the account, in
// order, debited or credited as DecideTransaction writes them. The
// reservation covers every debit, so a refusal here means the state is not
// what the reservation left (the saga then stays pending, for an operator).
func (a *Account) decideReservedLegs(cmd Command) Decision {
	h, ok := a.Holds[cmd.HoldID]
	if !ok || h.Status != HoldStatusActive {
		return reject(cmd, CodeHoldNotActive, false, "reservation %s is not active on %s", cmd.HoldID, a.ID)
	}
	scratch := *a
	scratch.Held -= h.Amount
	events := []NewEvent{{EvHoldReleased, HoldReleased{HoldID: h.ID, Amount: h.Amount, Reason: ReasonTransactionPosted, HeldAfter: scratch.Held, BalanceAfter: ptr(a.Balance)}}}
	for _, p := range cmd.Postings {
		var d Decision
		switch a.ID {
		case p.From:
			d = scratch.decideDebit(cmd, movement{p.Amount, p.Currency, ReasonTransactionOut, cmd.TransactionID})
		case p.To:
			d = scratch.decideCredit(cmd, movement{p.Amount, p.Currency, ReasonTransactionIn, cmd.TransactionID}, false)
		default:
			continue
		}
		if d.Rejection != nil {
			return reject(cmd, d.Rejection.Code, false, "reservation %s does not cover %s", cmd.HoldID, d.Rejection.Message)
		}
		switch e := d.Events[0].Data.(type) {
		case Debited:
			scratch.Balance = e.BalanceAfter
		case Credited:
			scratch.Balance = e.BalanceAfter
		}
		events = append(events, d.Events[0])
	}
	return apply(events...)
}

// ReasonTransactionPosted is the reason of a reservation released by its
// transaction's legs (ReasonHoldReleased is a release by a client or a refusal).
const ReasonTransactionPosted = "transaction_posted"

// TransactionSaga is the state of a reservation saga's stream. Revision is -1
// before any event.
type TransactionSaga struct {
	ID          string
	Revision    int64
	LastChain   string
	Key         string // the client's key ("" before TransactionRequested)
	Command     string // the client's command: post_transaction, or refund
	RequestHash Hash   // of the canonical request (Judge)
	Request     []byte
	Requested   *TransactionRequested
	Reserved    bool
	Refused     *TransactionReservationRefused
	// Outcome is the final event (TransactionPosted or TransactionRejected), nil
	// while the saga runs. A transaction decided in one append has it alone, at
	// revision 0, under the client's key.
	Outcome *StoredEvent
	// EffectiveAt is the transaction's effective_at (zero: none given),
	// carried by its steps.
	EffectiveAt time.Time
}

// DecidedFor is what the transaction's key was decided for (Judge).
func (ts *TransactionSaga) DecidedFor() *Decided {
	return &Decided{Hash: ts.RequestHash, Request: ts.Request}
}

// NewTransactionSaga is the state of a transaction stream without events.
func NewTransactionSaga(id string) *TransactionSaga {
	return &TransactionSaga{ID: id, Revision: -1}
}

// ClientKey is the key of the client command a transaction stream's event
// belongs to: its origin for a saga's markers and outcome, else its own.
func ClientKey(m Metadata) string {
	if m.Origin != "" {
		return m.Origin
	}
	return m.Key
}

// EvolveTransactionSaga applies a transaction stream's stored event, in order.
func EvolveTransactionSaga(ts *TransactionSaga, ev StoredEvent) error {
	payload, err := DecodeEvent(ev.Type, ev.Data)
	return EvolveTransactionSagaDecoded(ts, ev, payload, err)
}

// EvolveTransactionSagaDecoded is EvolveTransactionSaga for an event its reader
// has decoded: payload and decodeErr are what DecodeEvent(ev.Type, ev.Data)
// returned (EvolveTransferDecoded).
func EvolveTransactionSagaDecoded(ts *TransactionSaga, ev StoredEvent, payload any, decodeErr error) error {
	if int64(ev.Revision) != ts.Revision+1 {
		return fmt.Errorf("domain: %s: event at revision %d after %d", ev.Stream, ev.Revision, ts.Revision)
	}
	if ts.Outcome != nil {
		return fmt.Errorf("domain: %s: %s at revision %d after the transaction's outcome", ev.Stream, ev.Type, ev.Revision)
	}
	if decodeErr != nil {
		return decodeErr
	}
	e, ok := payload.(TransactionEvent)
	if !ok {
		return fmt.Errorf("domain: %s: %s does not belong to a transaction stream", ev.Stream, ev.Type)
	}
	if err := e.foldTransaction(ts, ev); err != nil {
		return err
	}
	ts.Revision, ts.LastChain = int64(ev.Revision), ev.Metadata.Chain
	return nil
}

// The transaction events' folds (TransactionEvent).

func (e *TransactionRequested) foldTransaction(ts *TransactionSaga, ev StoredEvent) error {
	if ts.Revision != -1 {
		return fmt.Errorf("domain: %s: a request after its start", ev.Stream)
	}
	ts.Requested, ts.Key, ts.Command, ts.RequestHash, ts.Request = e, ev.Metadata.Key, ev.Metadata.Command, ParseHash(ev.Metadata.RequestHash), ev.Metadata.Request
	ts.EffectiveAt = effectiveOf(ev.Metadata)
	return nil
}

func (e *TransactionReserved) foldTransaction(ts *TransactionSaga, _ StoredEvent) error {
	ts.Reserved = true
	return nil
}

func (e *TransactionReservationRefused) foldTransaction(ts *TransactionSaga, _ StoredEvent) error {
	ts.Refused = e
	return nil
}

// setOutcome records the transaction's outcome ev (TransactionPosted or
// TransactionRejected).
func (ts *TransactionSaga) setOutcome(ev StoredEvent) {
	if ts.Revision == -1 { // decided in one append: the client's own event
		ts.Key, ts.Command, ts.RequestHash, ts.Request = ev.Metadata.Key, ev.Metadata.Command, ParseHash(ev.Metadata.RequestHash), ev.Metadata.Request
	}
	ts.Outcome = &ev
}

// Decided reports whether the transaction has its outcome.
func (ts *TransactionSaga) Decided() bool { return ts.Outcome != nil }

// Accounts lists the accounts the saga's postings touch, sorted.
func (ts *TransactionSaga) Accounts() []string { return TransactionAccounts(ts.Requested.Postings) }

// StepCommand is the account command of a saga step (StepReserve, StepLeg or
// StepRelease) on account at time at.
func (ts *TransactionSaga) StepCommand(step, account string, at time.Time) Command {
	cmd := Command{
		AccountID: account, TransactionID: ts.ID, Postings: ts.Requested.Postings, HoldID: ReservationHoldID(ts.ID),
		At: at, EffectiveAt: ts.EffectiveAt, Origin: ts.Key, Ref: ts.ID,
	}
	switch step {
	case StepReserve:
		cmd.Type, cmd.IdempotencyKey = CmdTransactionReserve, StepKey(ts.Key, StepReserve+":"+account)
	case StepLeg:
		cmd.Type, cmd.IdempotencyKey = CmdTransactionLeg, LegKey(ts.Key, account)
	case StepRelease:
		cmd.Type, cmd.IdempotencyKey, cmd.Postings = CmdReleaseHold, StepKey(ts.Key, StepRelease+":"+account), nil
	default:
		panic("domain: unknown transaction step " + step)
	}
	return cmd
}

// ReservationOutcome is how an account decided its reservation: applied, or
// refused with code; After is the account as the step left it.
type ReservationOutcome struct {
	Account string
	Applied bool
	Code    Code
	Message string
	After   AccountView
	// OverdraftLimit is the account's (fixed when it opened), read for a refusal only.
	OverdraftLimit int64
}

// DecisiveRefusal is the refusal a transaction's reply gives when some of its
// reservations were refused: the one at the earliest posting, as one decision
// over every account would have met it (the posting's `from` first when both
// of its accounts refused), with the message naming the posting.
func (ts *TransactionSaga) DecisiveRefusal(outcomes []ReservationOutcome) *TransactionReservationRefused {
	var best *TransactionReservationRefused
	bestFrom := false
	for _, o := range outcomes {
		if o.Applied {
			continue
		}
		i := refusedPosting(ts.Requested.Postings, o)
		from := ts.Requested.Postings[i].From == o.Account
		if best == nil || i < best.Posting || (i == best.Posting && from && !bestFrom) {
			best = &TransactionReservationRefused{TransactionID: ts.ID, Account: o.Account, Code: o.Code, Message: fmt.Sprintf("posting %d: %s", i, o.Message), Posting: i}
			bestFrom = from
		}
	}
	return best
}

// refusedPosting is the posting at which an account's refusal falls: for funds,
// the first at which what the postings take out of it passes what it had
// available within its overdraft; for a currency, the first touching it in
// another one; otherwise the first touching it.
func refusedPosting(ps []Posting, o ReservationOutcome) int {
	first := -1
	var net int64
	for i, p := range ps {
		if p.From != o.Account && p.To != o.Account {
			continue
		}
		if first < 0 {
			first = i
		}
		switch o.Code {
		case CodeCurrencyMismatch:
			if p.Currency != o.After.Currency {
				return i
			}
		case CodeInsufficientFunds:
			if p.From == o.Account {
				net += p.Amount
			}
			if p.To == o.Account {
				net -= p.Amount
			}
			if o.After.Available-net < -o.OverdraftLimit {
				return i
			}
		}
	}
	return max(first, 0)
}

// OutcomeEvent is the transaction's final event, once every step has run: posted
// with every account as its legs left it (legs: each account's leg step
// events, the reservation's release first), or rejected with the decisive
// refusal and every account as it was (views: after its release, or its refusal).
func (ts *TransactionSaga) OutcomeEvent(legs map[string][]EventRef, views map[string]AccountView) NewEvent {
	accounts := make([]AccountView, 0, len(views))
	for _, id := range ts.Accounts() {
		accounts = append(accounts, views[id])
	}
	if ts.Refused != nil {
		return NewEvent{EvTransactionRejected, TransactionRejected{
			TransactionID: ts.ID, Postings: ts.Requested.Postings, Metadata: ts.Requested.Metadata,
			Code: ts.Refused.Code, Message: ts.Refused.Message, Posting: ts.Refused.Posting, Accounts: accounts,
		}}
	}
	posted := TransactionPosted{TransactionID: ts.ID, Postings: ts.Requested.Postings, Metadata: ts.Requested.Metadata, Accounts: accounts}
	for _, id := range ts.Accounts() {
		evs := legs[id]
		if len(evs) > 0 {
			posted.Legs = append(posted.Legs, evs[1:]...) // the release is not a leg
		}
	}
	return NewEvent{EvTransactionPosted, posted}
}
