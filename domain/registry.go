package domain

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"
)

// The event registry (ARCHITECTURE decision 16, STYLE "One declaration per
// event"): every event type the ledger writes is listed once in eventTypes, with
// its name, the kind of stream it belongs to and its payload type; how it changes
// an account, a transfer or a transaction is its payload's method of that kind's
// interface (AccountEvent, TransferEvent, TransactionEvent), written beside the
// payload, and the registration does not compile without it. DecodeEvent, the
// folds (EvolveAccount, EvolveTransfer, EvolveTransactionSaga), the recall of a
// key (AfterOf, RecallKey), EventSubject and the read models (AccountChange) all
// read it: none of them lists event types. TestEventRegistry walks every
// registered type through decoding and the folds, and the projections' own test
// through their dispatch, so that a missing case fails a test.

// Every event has two times (ARCHITECTURE decision 15): the time its command
// was recorded (Metadata.At), which orders every decision, and the time the
// money moved in the world (PROTOCOL.md §2.3 effective_at), which only reports
// read. The effective time is declared here once for every event type: it is
// the metadata's effective_at, written only when the command gave one (and on
// the events of the steps it caused), and the record time otherwise
// (EffectiveTime). No payload carries it.

// EffectiveTime is when the money of the event whose metadata is m moved in
// the world: its command's effective_at, or its record time when none was given.
func EffectiveTime(m Metadata) time.Time {
	if m.EffectiveAt != nil {
		return *m.EffectiveAt
	}
	return m.At
}

// StreamKind is the kind of stream an event type is written to.
type StreamKind uint8

const (
	// StreamAccount: account-<id>, folded by EvolveAccount (AccountEvent).
	StreamAccount StreamKind = iota + 1
	// StreamTransfer: transfer-<id>, folded by EvolveTransfer (TransferEvent).
	StreamTransfer
	// StreamTransaction: transaction-<id>, folded by EvolveTransactionSaga (TransactionEvent).
	StreamTransaction
	// StreamKey: key-<K>, its single KeyClaimed (BatchDecided for an atomic batch's key).
	StreamKey
)

var streamKindNames = [...]string{StreamAccount: "account", StreamTransfer: "transfer", StreamTransaction: "transaction", StreamKey: "key"}

func (k StreamKind) String() string {
	if int(k) < len(streamKindNames) && streamKindNames[k] != "" {
		return streamKindNames[k]
	}
	return fmt.Sprintf("StreamKind(%d)", uint8(k))
}

// EventType is the declaration of one event type.
type EventType struct {
	Name string
	Kind StreamKind
	// newPayload is a zero payload to decode into: a pointer to the payload type.
	newPayload func() any
	// plan reads the payload type's common bodies without encoding/json (nil:
	// every body goes through encoding/json).
	plan *payloadPlan
}

// New is a zero payload of the type, a pointer, as DecodeEvent returns it.
func (t EventType) New() any { return t.newPayload() }

// eventTypes is every event type, once.
var eventTypes = []EventType{
	accountEvent[AccountOpened](EvAccountOpened),
	accountEvent[Credited](EvCredited),
	accountEvent[Debited](EvDebited),
	accountEvent[HoldPlaced](EvHoldPlaced),
	accountEvent[HoldCaptured](EvHoldCaptured),
	accountEvent[HoldReleased](EvHoldReleased),
	accountEvent[AccountClosed](EvAccountClosed),
	accountEvent[CommandRejected](EvCommandRejected),

	transferEvent[TransferRequested](EvTransferRequested),
	transferEvent[TransferRejected](EvTransferRejected),
	transferEvent[TransferCreditRefused](EvTransferCreditRefused),
	transferEvent[TransferCompleted](EvTransferCompleted),
	transferEvent[TransferFailed](EvTransferFailed),
	transferEvent[TransferRefundRequested](EvTransferRefundRequested),
	transferEvent[RefundRejected](EvRefundRejected),
	transferEvent[RefundCreditRefused](EvRefundCreditRefused),
	transferEvent[RefundCompleted](EvRefundCompleted),
	transferEvent[RefundFailed](EvRefundFailed),

	transactionEvent[TransactionRequested](EvTransactionRequested),
	transactionEvent[TransactionReserved](EvTransactionReserved),
	transactionEvent[TransactionReservationRefused](EvTransactionReservationRefused),
	transactionEvent[TransactionPosted](EvTransactionPosted),
	transactionEvent[TransactionRejected](EvTransactionRejected),

	{Name: EvKeyClaimed, Kind: StreamKey, newPayload: func() any { return new(KeyClaimed) }, plan: newPayloadPlan(reflect.TypeFor[KeyClaimed]())},
	{Name: EvBatchDecided, Kind: StreamKey, newPayload: func() any { return new(BatchDecided) }, plan: newPayloadPlan(reflect.TypeFor[BatchDecided]())},
}

// eventTypeByName indexes eventTypes (a variable's initialiser, not init: it
// runs before anything reads it).
var eventTypeByName = indexEventTypes(eventTypes)

func indexEventTypes(types []EventType) map[string]EventType {
	m := make(map[string]EventType, len(types))
	for _, t := range types {
		if _, dup := m[t.Name]; dup {
			panic("domain: event type " + t.Name + " registered twice")
		}
		m[t.Name] = t
	}
	return m
}

// accountEvent declares an event type of account streams; P is *T, which must
// be an AccountEvent.
func accountEvent[T any, P interface {
	*T
	AccountEvent
}](name string) EventType {
	return EventType{Name: name, Kind: StreamAccount, newPayload: func() any { return P(new(T)) }, plan: newPayloadPlan(reflect.TypeFor[T]())}
}

// transferEvent declares an event type of transfer streams.
func transferEvent[T any, P interface {
	*T
	TransferEvent
}](name string) EventType {
	return EventType{Name: name, Kind: StreamTransfer, newPayload: func() any { return P(new(T)) }, plan: newPayloadPlan(reflect.TypeFor[T]())}
}

// transactionEvent declares an event type of transaction streams.
func transactionEvent[T any, P interface {
	*T
	TransactionEvent
}](name string) EventType {
	return EventType{Name: name, Kind: StreamTransaction, newPayload: func() any { return P(new(T)) }, plan: newPayloadPlan(reflect.TypeFor[T]())}
}

// EventTypes lists every registered event type.
func EventTypes() []EventType { return slices.Clone(eventTypes) }

// LookupEventType is the declaration of the event type called name.
func LookupEventType(name string) (EventType, bool) {
	t, ok := eventTypeByName[name]
	return t, ok
}

// DecodeEvent parses an event's data into its typed payload (a pointer), as
// encoding/json does: the common bodies through the type's plan
// (payloadPlan), the rest through encoding/json, which decides them.
func DecodeEvent(typ string, data []byte) (any, error) {
	t, ok := eventTypeByName[typ]
	if !ok {
		return nil, fmt.Errorf("domain: unknown event type %q", typ)
	}
	v := t.newPayload()
	if t.plan != nil && t.plan.decode(v, data) {
		return v, nil
	}
	reflect.ValueOf(v).Elem().SetZero() // the plan may have set some fields
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("domain: %s: %w", typ, err)
	}
	return v, nil
}

// internEventType is an event type's name as its declaration holds it, so that
// the records of an aggregate read from a store share it rather than each
// keeping the copy its event was decoded with.
func internEventType(name string) string {
	if t, ok := eventTypeByName[name]; ok {
		return t.Name
	}
	return name
}

// AccountEvent is the payload of an account stream's event. Its methods take
// the payload as a value, so that a decided payload (a value, as Decide makes
// it) and a decoded one (a pointer, as DecodeEvent makes it) are both one.
type AccountEvent interface {
	// Change is what the event does to the account: what the read models
	// show of it, and what a key's record is rebuilt from (RecallKey).
	Change() AccountChange
	// foldAccount applies the event to the aggregate, checking what it states
	// against the aggregate; m is its metadata.
	foldAccount(a *Account, m Metadata) error
}

// AccountChange is what an account event does to the account.
type AccountChange struct {
	// Opened: the event opens the account in Currency, with OverdraftLimit and
	// the client's Metadata.
	Opened         bool
	Currency       string
	OverdraftLimit int64
	Metadata       map[string]string
	// Status is the account's status after the event; "" when the event
	// leaves it as it was.
	Status AccountStatus
	// Balance and Held are the account after the event.
	Balance, Held AmountAfter
	// Moves: the event credits or debits Amount, for Reason (its Ref: a
	// transfer, a transaction, a refunded original's key).
	Moves       bool
	Amount      int64
	Reason, Ref string
	// UpTo: the movement is the debit of a command with up_to (v1.2 §2.3), and
	// Amount is what it moved.
	UpTo bool
	// Hold is the hold the event places, captures or releases; its ID is ""
	// for any other event.
	Hold HoldChange
	// Refused: the event records a refusal, with its Code and Message.
	Refused bool
	Code    Code
	Message string
}

// AccountStatus is an account's status as the read models show it.
type AccountStatus string

const (
	AccountStatusOpen   AccountStatus = "open"
	AccountStatusClosed AccountStatus = "closed"
)

// AmountAfter is a balance or held amount after an account event.
type AmountAfter struct {
	Value int64
	// Known: the event states it (or implies it: an account opens and closes
	// empty); events written before they stated the account do not.
	Known bool
	// Changed: the event sets it (the others leave it as it was).
	Changed bool
}

// statedAfter is an AmountAfter the event states when v is not nil.
func statedAfter(v *int64) AmountAfter {
	if v == nil {
		return AmountAfter{}
	}
	return AmountAfter{Value: *v, Known: true}
}

// setAfter is an AmountAfter the event sets.
func setAfter(v int64) AmountAfter { return AmountAfter{Value: v, Known: true, Changed: true} }

// HoldChange is what an account event does to a hold.
type HoldChange struct {
	ID     string
	Status HoldStatus // after the event
	// Amount is the hold's when placed, what was captured of it when captured,
	// what was released when released.
	Amount    int64
	Currency  string     // when placed
	ExpiresAt *time.Time // when placed; nil: never
}

// TransferEvent is the payload of a transfer stream's event (a pointer, as
// DecodeEvent makes it).
type TransferEvent interface {
	// foldTransfer applies the event to the transfer, and returns the saga it
	// belongs to; m is its metadata.
	foldTransfer(t *Transfer, m Metadata) (*Saga, error)
}

// TransactionEvent is the payload of a transaction stream's event (a pointer,
// as DecodeEvent makes it).
type TransactionEvent interface {
	// foldTransaction applies the event ev, whose payload it is, to the saga.
	foldTransaction(ts *TransactionSaga, ev StoredEvent) error
}
