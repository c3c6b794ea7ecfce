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
}

// Debited: see Credited.
type Debited Credited

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

// HoldReleased returns held funds to available (released or expired).
type HoldReleased struct {
	HoldID    string `json:"hold_id"`
	Amount    int64  `json:"amount"`
	Reason    string `json:"reason"`
	HeldAfter int64  `json:"held_after"`
	// BalanceAfter is the balance, unchanged (see Credited.HeldAfter).
	BalanceAfter *int64 `json:"balance_after,omitempty"`
}

// AccountClosed closes an account.
type AccountClosed struct {
	AccountID string `json:"account_id"`
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

// KeyClaimed binds a client key to one request forever.
type KeyClaimed struct {
	Key         string          `json:"key"`
	Command     string          `json:"command"`
	RequestHash string          `json:"request_hash"`
	Request     json.RawMessage `json:"request"`
	Stream      string          `json:"stream"` // the stream that decides the command
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

// DecodeMetadata parses event metadata.
func DecodeMetadata(b []byte) (Metadata, error) {
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("domain: metadata: %w", err)
	}
	return m, nil
}

// DecodeEvent parses an event's data into its typed payload.
func DecodeEvent(typ string, data []byte) (any, error) {
	var v any
	switch typ {
	case EvAccountOpened:
		v = &AccountOpened{}
	case EvCredited:
		v = &Credited{}
	case EvDebited:
		v = &Debited{}
	case EvHoldPlaced:
		v = &HoldPlaced{}
	case EvHoldCaptured:
		v = &HoldCaptured{}
	case EvHoldReleased:
		v = &HoldReleased{}
	case EvAccountClosed:
		v = &AccountClosed{}
	case EvCommandRejected:
		v = &CommandRejected{}
	case EvKeyClaimed:
		v = &KeyClaimed{}
	case EvTransactionPosted:
		v = &TransactionPosted{}
	case EvTransactionRejected:
		v = &TransactionRejected{}
	case EvTransactionRequested:
		v = &TransactionRequested{}
	case EvTransactionReserved:
		v = &TransactionReserved{}
	case EvTransactionReservationRefused:
		v = &TransactionReservationRefused{}
	default:
		if d, ok := decodeTransferEvent(typ); ok {
			v = d
			break
		}
		return nil, fmt.Errorf("domain: unknown event type %q", typ)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("domain: %s: %w", typ, err)
	}
	return v, nil
}

// transferEventDecoders is filled by transfer.go: event type -> new payload.
var transferEventDecoders = map[string]func() any{}

func decodeTransferEvent(typ string) (any, bool) {
	f, ok := transferEventDecoders[typ]
	if !ok {
		return nil, false
	}
	return f(), true
}
