package domain

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Event types of account streams.
const (
	EvAccountOpened   = "AccountOpened"
	EvCredited        = "Credited"
	EvDebited         = "Debited"
	EvHoldPlaced      = "HoldPlaced"
	EvHoldCaptured    = "HoldCaptured"
	EvHoldReleased    = "HoldReleased"
	EvAccountClosed   = "AccountClosed"
	EvCommandRejected = "CommandRejected"
	// EvKeyClaimed is the single event of a key stream: it binds a client key to one
	// request (its hash and canonical form) and names the stream that decides it.
	EvKeyClaimed = "KeyClaimed"
	// EvBatchDecided is the single event of an atomic batch's key stream: the
	// batch's claim (a KeyClaimed of command "batch") and its decision.
	EvBatchDecided = "BatchDecided"
)

// Reasons of money movements (the statement's "why").
const (
	ReasonDeposit            = "deposit"
	ReasonWithdrawal         = "withdrawal"
	ReasonTransferOut        = "transfer_out"
	ReasonTransferIn         = "transfer_in"
	ReasonTransferCompensate = "transfer_compensation"
	ReasonRefund             = "refund"
	ReasonRefundOut          = "refund_out"
	ReasonRefundIn           = "refund_in"
	ReasonRefundCompensate   = "refund_compensation"
	ReasonHoldExpired        = "expired"
	// ReasonCaptureIn credits a captured hold's amount to the capture's `to` account.
	ReasonCaptureIn    = "capture_in"
	ReasonHoldReleased = "released"
)

// TransferReason reports whether a money movement is a step of a transfer's saga
// or of a transfer refund's: its ref is then the transfer's ID.
func TransferReason(reason string) bool {
	switch reason {
	case ReasonTransferOut, ReasonTransferIn, ReasonTransferCompensate, ReasonRefundOut, ReasonRefundIn, ReasonRefundCompensate:
		return true
	}
	return false
}

// AccountOpened opens an account.
type AccountOpened struct {
	AccountID      string            `json:"account_id"`
	Currency       string            `json:"currency"`
	OverdraftLimit int64             `json:"overdraft_limit"`
	Metadata       map[string]string `json:"metadata,omitempty"`
}

// Change opens the account, empty.
func (e AccountOpened) Change() AccountChange {
	return AccountChange{Opened: true, Currency: e.Currency, OverdraftLimit: e.OverdraftLimit, Metadata: e.Metadata, Status: AccountStatusOpen,
		Balance: setAfter(0), Held: setAfter(0)}
}

func (e AccountOpened) foldAccount(a *Account, m Metadata) error {
	a.Opened, a.Currency, a.OverdraftLimit, a.Metadata = true, e.Currency, e.OverdraftLimit, e.Metadata
	a.EffectiveFrom = EffectiveTime(m)
	return nil
}

// Credited and Debited move money into or out of an account. BalanceAfter is the
// fold's result, written so that statements need no fold and audits can check it.
type Credited struct {
	Amount       int64  `json:"amount"`
	Currency     string `json:"currency"`
	Reason       string `json:"reason"`
	Ref          string `json:"ref,omitempty"` // transfer id or original key
	BalanceAfter int64  `json:"balance_after"`
	// HeldAfter is the held amount, unchanged by the movement: with BalanceAfter
	// it is the whole account after the event, so that a reply can be rebuilt
	// from the event alone (AfterOf). Nil in events written before it existed.
	HeldAfter *int64 `json:"held_after,omitempty"`
	// Metadata is the client's, of the command that moved the money (v1.1).
	Metadata map[string]string `json:"metadata,omitempty"`
	// Requested, on a debit of a command with up_to (v1.2 §2.3: a withdrawal,
	// a transfer's debit), is the maximum the command asked for; Amount is what
	// moved: the smaller of it and what was available. Nil otherwise.
	Requested *int64 `json:"requested,omitempty"`
}

// Debited: see Credited.
type Debited Credited

// Change moves the balance; held is as it was.
func (e Credited) Change() AccountChange {
	return AccountChange{Balance: setAfter(e.BalanceAfter), Held: statedAfter(e.HeldAfter), Moves: true, Amount: e.Amount, Reason: e.Reason, Ref: e.Ref, UpTo: e.Requested != nil}
}

func (e Credited) foldAccount(a *Account, m Metadata) error {
	bal, ok := addMinor(a.Balance, e.Amount)
	if !ok || bal != e.BalanceAfter {
		return fmt.Errorf("credit of %d to %d does not give balance_after %d", e.Amount, a.Balance, e.BalanceAfter)
	}
	return a.moved(bal, e, m)
}

// Change moves the balance; held is as it was.
func (e Debited) Change() AccountChange { return Credited(e).Change() }

func (e Debited) foldAccount(a *Account, m Metadata) error {
	bal, ok := subMinor(a.Balance, e.Amount)
	if !ok || bal != e.BalanceAfter {
		return fmt.Errorf("debit of %d from %d does not give balance_after %d", e.Amount, a.Balance, e.BalanceAfter)
	}
	return a.moved(bal, Credited(e), m)
}

// HoldPlaced reserves funds.
type HoldPlaced struct {
	HoldID    string     `json:"hold_id"`
	Amount    int64      `json:"amount"`
	Currency  string     `json:"currency"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	HeldAfter int64      `json:"held_after"`
	// BalanceAfter is the balance, unchanged by the hold (see Credited.HeldAfter).
	BalanceAfter *int64            `json:"balance_after,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"` // the client's (v1.1)
}

// Change places the hold; the balance is as it was.
func (e HoldPlaced) Change() AccountChange {
	return AccountChange{Balance: statedAfter(e.BalanceAfter), Held: setAfter(e.HeldAfter),
		Hold: HoldChange{ID: e.HoldID, Status: HoldStatusActive, Amount: e.Amount, Currency: e.Currency, ExpiresAt: e.ExpiresAt}}
}

func (e HoldPlaced) foldAccount(a *Account, m Metadata) error {
	if err := a.stated("balance_after", e.BalanceAfter, a.Balance); err != nil {
		return err
	}
	h := &Hold{ID: e.HoldID, Amount: e.Amount, Status: HoldStatusActive, Key: m.Key, Findable: m.Subject != ""}
	if e.ExpiresAt != nil {
		h.ExpiresAt = *e.ExpiresAt
	}
	a.SetHold(h)
	a.Held += e.Amount
	return nil
}

// HoldCaptured debits captured funds and releases the rest of the hold.
type HoldCaptured struct {
	HoldID       string `json:"hold_id"`
	Amount       int64  `json:"amount"`   // debited
	Released     int64  `json:"released"` // returned to available
	Currency     string `json:"currency"`
	BalanceAfter int64  `json:"balance_after"`
	HeldAfter    int64  `json:"held_after"`
	// To is the account the captured amount was credited to in the same write
	// (v1.1); empty when it left the ledger.
	To string `json:"to,omitempty"`
	// Metadata is the capture command's (v1.1).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Change captures the hold: the balance and held amount both move.
func (e HoldCaptured) Change() AccountChange {
	return AccountChange{Balance: setAfter(e.BalanceAfter), Held: setAfter(e.HeldAfter),
		Hold: HoldChange{ID: e.HoldID, Status: HoldStatusCaptured, Amount: e.Amount}}
}

func (e HoldCaptured) foldAccount(a *Account, _ Metadata) error {
	h, ok := a.Holds[e.HoldID]
	if !ok || h.Status != HoldStatusActive || e.Amount+e.Released != h.Amount {
		return fmt.Errorf("capture of hold %s does not match the hold", e.HoldID)
	}
	a.Balance -= e.Amount
	a.Held -= h.Amount
	h.Status = HoldStatusCaptured
	a.closed(h)
	return nil
}

// HoldReleased returns held funds to available (released or expired).
type HoldReleased struct {
	HoldID    string `json:"hold_id"`
	Amount    int64  `json:"amount"`
	Reason    string `json:"reason"`
	HeldAfter int64  `json:"held_after"`
	// BalanceAfter is the balance, unchanged (see Credited.HeldAfter).
	BalanceAfter *int64 `json:"balance_after,omitempty"`
}

// Change releases (or expires) the hold; the balance is as it was.
func (e HoldReleased) Change() AccountChange {
	return AccountChange{Balance: statedAfter(e.BalanceAfter), Held: setAfter(e.HeldAfter),
		Hold: HoldChange{ID: e.HoldID, Status: releasedStatus(e.Reason), Amount: e.Amount}}
}

func (e HoldReleased) foldAccount(a *Account, _ Metadata) error {
	h, ok := a.Holds[e.HoldID]
	if !ok || h.Status != HoldStatusActive || e.Amount != h.Amount {
		return fmt.Errorf("release of hold %s does not match the hold", e.HoldID)
	}
	if err := a.stated("balance_after", e.BalanceAfter, a.Balance); err != nil {
		return err
	}
	a.Held -= h.Amount
	h.Status = releasedStatus(e.Reason)
	a.closed(h)
	return nil
}

// AccountClosed closes an account.
type AccountClosed struct {
	AccountID string `json:"account_id"`
}

// Change closes the account, which is empty.
func (e AccountClosed) Change() AccountChange {
	return AccountChange{Status: AccountStatusClosed, Balance: AmountAfter{Known: true}, Held: AmountAfter{Known: true}}
}

func (e AccountClosed) foldAccount(a *Account, _ Metadata) error {
	a.Closed = true
	return nil
}

// CommandRejected records a business refusal so that a retry gets it again.
type CommandRejected struct {
	Command string `json:"command"`
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// BalanceAfter and HeldAfter are the account as the refusal left it (as it
	// was), so that the refusal's reply can be rebuilt from the event alone. Nil
	// in events written before they existed, and on streams that are not accounts.
	BalanceAfter *int64 `json:"balance_after,omitempty"`
	HeldAfter    *int64 `json:"held_after,omitempty"`
}

// Change is none: the account is as it was.
func (e CommandRejected) Change() AccountChange {
	return AccountChange{Balance: statedAfter(e.BalanceAfter), Held: statedAfter(e.HeldAfter), Refused: true, Code: e.Code, Message: e.Message}
}

func (e CommandRejected) foldAccount(a *Account, _ Metadata) error {
	if err := a.stated("balance_after", e.BalanceAfter, a.Balance); err != nil {
		return err
	}
	return a.stated("held_after", e.HeldAfter, a.Held)
}

// KeyClaimed binds a client key to one request forever.
type KeyClaimed struct {
	Key         string          `json:"key"`
	Command     string          `json:"command"`
	RequestHash string          `json:"request_hash"`
	Request     json.RawMessage `json:"request"`
	// Stream is the stream that decides the command; a refund of a
	// transaction whose instance lost the claimed refund slot to another key
	// (a store that appends one stream a write) is decided in a later slot
	// (NextRefundSlot).
	Stream string `json:"stream"`
	// Revision is where the command's first event was to be written in Stream
	// when the claim was made: exact where the claim and the decision are written
	// together, a lower bound where the claim is written first (a decision taken
	// again after a concurrent write lands later). Nil in older claims.
	Revision *uint64 `json:"revision,omitempty"`
}

// DecidedFor is what the claimed key was decided for (Judge); nil for a nil
// claim, a key never claimed.
func (c *KeyClaimed) DecidedFor() *Decided {
	if c == nil {
		return nil
	}
	return &Decided{Hash: ParseHash(c.RequestHash), Request: c.Request}
}

// Metadata travels with every event the ledger writes.
type Metadata struct {
	Key         string    `json:"key"`                // idempotency key (derived for saga steps)
	Command     string    `json:"command"`            // command type
	RequestHash string    `json:"request_hash"`       // hex SHA-256 of the canonical request
	Index       int       `json:"i"`                  // index of the event within the command's write to its stream
	Count       int       `json:"n"`                  // events the command wrote to this stream
	At          time.Time `json:"at"`                 // when the ledger accepted the command
	Origin      string    `json:"origin,omitempty"`   // the client key that caused a saga step
	Request     []byte    `json:"request,omitempty"`  // canonical request, on the first event only
	Chain       string    `json:"chain,omitempty"`    // tamper-evidence hash chain (read side)
	Schema      int       `json:"schema,omitempty"`   // payload schema version
	Producer    string    `json:"producer,omitempty"` // instance that wrote it, for diagnostics
	// Claimed: the key's claim (KeyClaimed in its key stream) was written before
	// this write. Set on saga steps where the store finds a forgotten key by its
	// claim (Account.PinUnclaimedSteps); a client key's write always has a claim.
	Claimed bool `json:"claimed,omitempty"`
	// Subject is what the event is about within its stream (EventSubject), as
	// the store indexes it (eventstore.EventData.Subject).
	Subject string `json:"subject,omitempty"`
	// EffectiveAt is the command's effective_at (v1.2 §2.3) when it gave one;
	// nil: the money moved when it was recorded (EffectiveTime).
	EffectiveAt *time.Time `json:"effective_at,omitempty"`
}

// NewEvent is an event decided but not yet written.
type NewEvent struct {
	Type string
	Data any
}

// StoredEvent is an event as the domain reads it back (decoupled from eventstore).
type StoredEvent struct {
	ID       uuid.UUID
	Stream   string
	Revision uint64
	Position string // global position, as the event store renders it
	Type     string
	Data     []byte
	Metadata Metadata
}
