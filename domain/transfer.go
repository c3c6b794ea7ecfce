package domain

import (
	"fmt"
	"slices"
	"time"
)

// A transfer stream (TransferStream) records a transfer saga and the sagas of its
// refunds (ARCHITECTURE decision 6). Money never lives here: the steps move it in
// account streams under derived keys (StepKey), and the transfer stream records
// only what was requested and how each saga was decided, in this layout:
//
//	TransferRequested                 key K, with the claim of K (rev 0)
//	  debit the source                StepKey(K, "debit") on account-<from>
//	  refused:  TransferRejected      StepKey(K, "reject")
//	  applied:  credit the destination  StepKey(K, "credit") on account-<to>
//	    applied: TransferCompleted    StepKey(K, "complete")
//	    refused: TransferCreditRefused  StepKey(K, "refuse"), THEN
//	             compensate the source  StepKey(K, "compensate") on account-<from>, then
//	             TransferFailed       StepKey(K, "fail")
//
// A refund R of a completed transfer is the same saga in the other direction
// (debit the destination, credit the source) with keys derived from R and its own
// markers (TransferRefundRequested, RefundRejected, RefundCreditRefused,
// RefundCompleted, RefundFailed), each carrying refund_key.
//
// The credit refusal is recorded before the compensation on purpose: a recovery
// that found the transfer pending could otherwise credit the destination after
// the source was compensated, creating money.

// Event types of transfer streams.
const (
	EvTransferRequested       = "TransferRequested"
	EvTransferRejected        = "TransferRejected"
	EvTransferCreditRefused   = "TransferCreditRefused"
	EvTransferCompleted       = "TransferCompleted"
	EvTransferFailed          = "TransferFailed"
	EvTransferRefundRequested = "TransferRefundRequested"
	EvRefundRejected          = "RefundRejected"
	EvRefundCreditRefused     = "RefundCreditRefused"
	EvRefundCompleted         = "RefundCompleted"
	EvRefundFailed            = "RefundFailed"
)

// Step names of the saga markers written to the transfer stream (StepKey).
const (
	StepReject   = "reject"
	StepRefuse   = "refuse"
	StepComplete = "complete"
	StepFail     = "fail"
)

// TransferRequested opens a transfer saga.
type TransferRequested struct {
	TransferID string `json:"transfer_id"`
	From       string `json:"from"`
	To         string `json:"to"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
	// Metadata is the client's (v1.1); the saga's steps carry it to the accounts.
	Metadata map[string]string `json:"metadata,omitempty"`
	// UpTo (v1.2 §2.3): Amount is a maximum; the debit moves as much of it as
	// the source has available, and the saga's later events record that amount.
	UpTo bool `json:"up_to,omitempty"`
}

// TransferRejected ends a transfer that was refused before any money moved.
type TransferRejected struct {
	TransferID string `json:"transfer_id"`
	Code       Code   `json:"code"`
	Message    string `json:"message"`
}

// TransferCreditRefused records that the destination refused the credit: the
// source is compensated next. Moved, for a transfer with up_to, is what its
// debit moved: what the compensation returns.
type TransferCreditRefused struct {
	TransferID string `json:"transfer_id"`
	Code       Code   `json:"code"`
	Message    string `json:"message"`
	Moved      int64  `json:"moved,omitempty"`
}

// TransferFailed ends a transfer whose source was credited back after a refused credit.
type TransferFailed TransferRejected

// TransferCompleted ends a transfer whose money reached the destination.
type TransferCompleted struct {
	TransferID string `json:"transfer_id"`
	Amount     int64  `json:"amount"`
}

// TransferRefundRequested opens the saga of a refund of the transfer and
// reserves its amount against the transfer's.
type TransferRefundRequested struct {
	RefundKey string            `json:"refund_key"`
	Amount    int64             `json:"amount"`
	Metadata  map[string]string `json:"metadata,omitempty"` // the refund's (v1.1)
}

// RefundRejected ends a refund refused before any money moved (refused outright,
// or its debit was refused); it releases the refund's reservation.
type RefundRejected struct {
	RefundKey string `json:"refund_key"`
	Code      Code   `json:"code"`
	Message   string `json:"message"`
}

// RefundCreditRefused records that the transfer's source refused the refund's
// credit: the destination is compensated next.
type RefundCreditRefused RefundRejected

// RefundFailed ends a refund whose debit was compensated; it releases the reservation.
type RefundFailed RefundRejected

// RefundCompleted ends a refund whose money went back to the transfer's source.
type RefundCompleted struct {
	RefundKey string `json:"refund_key"`
	Amount    int64  `json:"amount"`
}

// The transfer events' folds (TransferEvent).

func (e *TransferRequested) foldTransfer(t *Transfer, m Metadata) (*Saga, error) {
	return t.openSaga(e, m)
}

func (e *TransferRejected) foldTransfer(t *Transfer, m Metadata) (*Saga, error) {
	if t.Saga != nil && m.Key == t.Saga.Key {
		t.Saga.Outright = true
	}
	return t.Saga, t.advance(t.Saga, SagaPending, SagaRejected, e.Code, e.Message)
}

func (e *TransferCreditRefused) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	if err := t.fixMoved(e.Moved); err != nil {
		return nil, err
	}
	return t.Saga, t.advance(t.Saga, SagaPending, SagaCompensating, e.Code, e.Message)
}

func (e *TransferCompleted) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	if err := t.fixMoved(e.Amount); err != nil {
		return nil, err
	}
	return t.Saga, t.advance(t.Saga, SagaPending, SagaCompleted, CodeOK, "")
}

// fixMoved sets the amount of a transfer with up_to to what its debit moved,
// as a marker records it (v1.2 §2.3): from then on the transfer, its
// compensation and its refunds are of that amount. A transfer without up_to
// must record its own amount.
func (t *Transfer) fixMoved(moved int64) error {
	switch {
	case t.Saga == nil:
		return nil // advance says what is wrong
	case !t.Saga.UpTo && moved != 0 && moved != t.Amount:
		return fmt.Errorf("transfer %s of %d records %d moved", t.ID, t.Amount, moved)
	case t.Saga.UpTo && (moved <= 0 || moved > t.Amount):
		return fmt.Errorf("transfer %s of up to %d records %d moved", t.ID, t.Amount, moved)
	case t.Saga.UpTo:
		t.Amount, t.Saga.Amount = moved, moved
	}
	return nil
}

func (e *TransferFailed) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	return t.Saga, t.advance(t.Saga, SagaCompensating, SagaFailed, e.Code, e.Message)
}

func (e *TransferRefundRequested) foldTransfer(t *Transfer, m Metadata) (*Saga, error) {
	return t.reserveRefund(e, m)
}

func (e *RefundRejected) foldTransfer(t *Transfer, m Metadata) (*Saga, error) {
	return t.rejectRefund(e, m)
}

func (e *RefundCreditRefused) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	return t.advanceRefund(e.RefundKey, SagaPending, SagaCompensating, e.Code, e.Message)
}

func (e *RefundCompleted) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	return t.advanceRefund(e.RefundKey, SagaPending, SagaCompleted, CodeOK, "")
}

func (e *RefundFailed) foldTransfer(t *Transfer, _ Metadata) (*Saga, error) {
	return t.advanceRefund(e.RefundKey, SagaCompensating, SagaFailed, e.Code, e.Message)
}

// SagaStage is where a saga stands.
type SagaStage uint8

const (
	// SagaPending: requested; the debit and then the credit run next.
	SagaPending SagaStage = iota
	// SagaCompensating: the credit was refused; the compensation runs next.
	SagaCompensating
	// SagaCompleted: the money reached its destination.
	SagaCompleted
	// SagaRejected: refused before any money moved.
	SagaRejected
	// SagaFailed: the credit was refused and the debit compensated.
	SagaFailed
)

// Decided reports whether the saga has reached its end.
func (s SagaStage) Decided() bool { return s >= SagaCompleted }

func (s SagaStage) String() string {
	switch s {
	case SagaPending:
		return "pending"
	case SagaCompensating:
		return "compensating"
	case SagaCompleted:
		return "completed"
	case SagaRejected:
		return "rejected"
	case SagaFailed:
		return "failed"
	}
	return fmt.Sprintf("SagaStage(%d)", uint8(s))
}

// Transfer statuses (PROTOCOL.md §3-4).
const (
	TransferStatusPending   = "pending"
	TransferStatusCompleted = "completed"
	TransferStatusRejected  = "rejected"
	TransferStatusFailed    = "failed"
)

// Status is the protocol's transfer.status of a saga at this stage.
func (s SagaStage) Status() string {
	switch s {
	case SagaCompleted:
		return TransferStatusCompleted
	case SagaRejected:
		return TransferStatusRejected
	case SagaFailed:
		return TransferStatusFailed
	}
	return TransferStatusPending
}

// Saga is one money movement recorded in a transfer stream: the transfer itself or
// one of its refunds. It moves Amount from account Out to account In.
type Saga struct {
	Key         string      // the client key: the transfer's or the refund's
	Command     CommandType // CmdTransfer or CmdRefund
	RequestHash Hash        // SHA-256 of the canonical request (Judge)
	Request     []byte      // canonical request JSON
	Refund      bool
	Out, In     string // account debited, account credited
	Amount      int64
	Currency    string
	Stage       SagaStage
	// Outright is set when the saga was refused with its request, before any step
	// ran (a transfer to itself, a refund over the limit).
	Outright bool
	Code     Code   // the refusal, once refused
	Message  string // its message
	// UpTo (v1.2 §2.3): Amount is the maximum until the debit moved (then what
	// it moved: Moving, and the markers record it).
	UpTo bool
	At   time.Time
	// EffectiveAt is the transfer's or the refund's effective_at (zero: none
	// given), carried by its steps.
	EffectiveAt time.Time
	// Metadata is the client's, of the transfer or the refund (v1.1).
	Metadata map[string]string
	// Events are the saga's events in the transfer stream, in stream order.
	Events []EventRef
	// Position is the global position of the saga's last event in the stream.
	Position string
}

// DecidedFor is what the saga's key was decided for (Judge).
func (sg *Saga) DecidedFor() *Decided {
	return &Decided{Hash: sg.RequestHash, Request: sg.Request}
}

// Transfer is the state of a transfer stream. Revision is -1 before any event.
type Transfer struct {
	ID        string
	Requested bool
	From, To  string
	Amount    int64
	Currency  string
	// Saga is the transfer's own saga (nil before TransferRequested).
	Saga *Saga
	// Refunds are the refunds of the transfer by refund key; RefundOrder lists
	// their keys in the order they were first recorded.
	Refunds     map[string]*Saga
	RefundOrder []string
	// Reserved is the amount of refunds that are pending or completed: the refunds
	// of one transfer never exceed it, in flight included.
	Reserved  int64
	Revision  int64
	LastChain string
}

// NewTransfer is the state of a transfer stream that has no events.
func NewTransfer(id string) *Transfer {
	return &Transfer{ID: id, Revision: -1, Refunds: map[string]*Saga{}}
}

// Clone is a copy of t that evolves apart from it: its sagas are copies too
// (their requests and metadata are shared, and never written).
func (t *Transfer) Clone() *Transfer {
	c := *t
	c.Saga = t.Saga.clone()
	c.Refunds = make(map[string]*Saga, len(t.Refunds))
	for k, s := range t.Refunds {
		c.Refunds[k] = s.clone()
	}
	c.RefundOrder = slices.Clone(t.RefundOrder)
	return &c
}

func (s *Saga) clone() *Saga {
	if s == nil {
		return nil
	}
	c := *s
	c.Events = slices.Clone(s.Events)
	return &c
}

// Key is the transfer's client key ("" before TransferRequested).
func (t *Transfer) Key() string {
	if t.Saga == nil {
		return ""
	}
	return t.Saga.Key
}

// SagaOf returns the saga of a client key in this stream: the transfer's or a refund's.
func (t *Transfer) SagaOf(key string) (*Saga, bool) {
	if t.Saga != nil && t.Saga.Key == key {
		return t.Saga, true
	}
	s, ok := t.Refunds[key]
	return s, ok
}

// Pending lists the keys of the sagas not yet decided, the transfer's first.
func (t *Transfer) Pending() []string {
	var out []string
	if t.Saga != nil && !t.Saga.Stage.Decided() {
		out = append(out, t.Saga.Key)
	}
	for _, k := range t.RefundOrder {
		if !t.Refunds[k].Stage.Decided() {
			out = append(out, k)
		}
	}
	return out
}

// Refundable is what refunds may still take from the transfer.
func (t *Transfer) Refundable() int64 {
	if t.Saga == nil || t.Saga.Stage != SagaCompleted {
		return 0
	}
	return t.Amount - t.Reserved
}

// DecideTransfer decides a transfer request on its transfer stream. The caller
// answers a request whose key already owns the stream from t.Saga first; any other
// request for a used transfer id is transfer_exists (not recorded: it concerns
// someone else's transfer, and it never changes). A transfer to itself is recorded
// as rejected together with its request; everything else is decided by the saga's
// steps (the caller checks beforehand that both accounts exist).
func DecideTransfer(t *Transfer, cmd Command) Decision {
	if t.Requested || t.Revision >= 0 {
		return reject(cmd, CodeTransferExists, false, "transfer %s already exists", t.ID)
	}
	req := NewEvent{EvTransferRequested, TransferRequested{TransferID: cmd.TransferID, From: cmd.From, To: cmd.To, Amount: cmd.Amount, Currency: cmd.Currency, Metadata: cmd.Metadata, UpTo: cmd.UpTo}}
	if cmd.From == cmd.To {
		msg := fmt.Sprintf("transfer %s names account %s as both source and destination", cmd.TransferID, cmd.From)
		return Decision{
			Events:    []NewEvent{req, {EvTransferRejected, TransferRejected{TransferID: cmd.TransferID, Code: CodeSameAccount, Message: msg}}},
			Rejection: &Rejection{Code: CodeSameAccount, Message: msg, Recorded: true},
		}
	}
	return apply(req)
}

// DecideTransferRefund decides a refund of the transfer whose key is
// cmd.OriginalKey. The caller answers a known refund key from t.Refunds first and
// lets a pending transfer reach its decision before asking (a pending transfer
// is refused without record, so that a retry decides again).
func DecideTransferRefund(t *Transfer, cmd Command) Decision {
	rejected := func(code Code, format string, args ...any) Decision {
		msg := fmt.Sprintf(format, args...)
		return Decision{
			Events:    []NewEvent{{EvRefundRejected, RefundRejected{RefundKey: cmd.IdempotencyKey, Code: code, Message: msg}}},
			Rejection: &Rejection{Code: code, Message: msg, Recorded: true},
		}
	}
	if r, ok := t.Refunds[cmd.OriginalKey]; ok {
		return rejected(CodeNotRefundable, "%s %q cannot be refunded", r.Command, cmd.OriginalKey)
	}
	if t.Saga == nil || t.Saga.Key != cmd.OriginalKey {
		return reject(cmd, CodeOriginalNotFound, false, "no command with key %q", cmd.OriginalKey)
	}
	switch t.Saga.Stage {
	case SagaCompleted:
	case SagaPending, SagaCompensating:
		return reject(cmd, CodeNotRefundable, false, "transfer %s is still pending", t.ID)
	default:
		return rejected(CodeNotRefundable, "transfer %q (%s) cannot be refunded", cmd.OriginalKey, t.Saga.Stage.Status())
	}
	remaining := t.Refundable()
	amount := remaining
	if cmd.HasAmount {
		amount = cmd.Amount
	}
	if amount <= 0 || amount > remaining {
		return rejected(CodeRefundExceedsOriginal, "refund of %d exceeds the %d still refundable of %q", amount, remaining, cmd.OriginalKey)
	}
	return apply(NewEvent{EvTransferRefundRequested, TransferRefundRequested{RefundKey: cmd.IdempotencyKey, Amount: amount, Metadata: cmd.Metadata}})
}

// StepCommand is the account command of a saga step (StepDebit, StepCredit or
// StepCompensate) at time at. Its key is derived from the saga's, so that
// running it again answers from the account's record instead of moving money.
func (t *Transfer) StepCommand(s *Saga, step string, at time.Time) Command {
	cmd := Command{
		IdempotencyKey: StepKey(s.Key, step), TransferID: t.ID, Amount: s.Amount, HasAmount: true,
		Currency: s.Currency, At: at, EffectiveAt: s.EffectiveAt, Origin: s.Key, Ref: t.ID, Metadata: s.Metadata,
	}
	out, in, comp := ReasonTransferOut, ReasonTransferIn, ReasonTransferCompensate
	if s.Refund {
		out, in, comp = ReasonRefundOut, ReasonRefundIn, ReasonRefundCompensate
	}
	switch step {
	case StepDebit:
		cmd.Type, cmd.AccountID, cmd.Reason, cmd.UpTo = CmdTransferDebit, s.Out, out, s.UpTo
	case StepCredit:
		cmd.Type, cmd.AccountID, cmd.Reason = CmdTransferCredit, s.In, in
	case StepCompensate:
		cmd.Type, cmd.AccountID, cmd.Reason = CmdTransferCompensate, s.Out, comp
	default:
		panic("domain: unknown saga step " + step)
	}
	return cmd
}

// StepOutcome is how an account decided a saga step.
type StepOutcome struct {
	Applied bool
	Code    Code
	Message string
	// Moved is what an applied debit with up_to moved (KeyRecord.Moved); 0
	// for any other step.
	Moved int64
}

// Moving is saga s once its debit applied with outcome o: for a saga with
// up_to, a copy whose Amount is what the debit moved, so that the credit, the
// compensation and the markers are of that amount; s itself otherwise.
func (s *Saga) Moving(o StepOutcome) (*Saga, error) {
	if !s.UpTo {
		return s, nil
	}
	if !o.Applied || o.Moved <= 0 || o.Moved > s.Amount {
		return nil, fmt.Errorf("domain: debit of %q (up to %d) moved %d", s.Key, s.Amount, o.Moved)
	}
	c := s.clone()
	c.Amount = o.Moved
	return c, nil
}

// SagaMarker is what a transfer stream records after a saga's step: the
// marker's derived key and events; no events when the saga simply goes on.
type SagaMarker struct {
	Key    string
	Events []NewEvent
}

// DecideSagaMarker decides what the transfer stream records after a step of saga
// s: the marker, or no events when the saga simply goes on (an applied debit). An outcome that the saga's stage does not allow (a
// refused compensation, a step out of order) is an error: nothing may be written.
func DecideSagaMarker(t *Transfer, s *Saga, step string, o StepOutcome) (SagaMarker, error) {
	type marker struct{ step, typ string }
	var m marker
	switch {
	case s.Stage == SagaPending && step == StepDebit && o.Applied:
		return SagaMarker{}, nil
	case s.Stage == SagaPending && step == StepDebit:
		m = marker{StepReject, EvTransferRejected}
	case s.Stage == SagaPending && step == StepCredit && o.Applied:
		m = marker{StepComplete, EvTransferCompleted}
	case s.Stage == SagaPending && step == StepCredit:
		m = marker{StepRefuse, EvTransferCreditRefused}
	case s.Stage == SagaCompensating && step == StepCompensate && o.Applied:
		m = marker{StepFail, EvTransferFailed}
		o.Code, o.Message = s.Code, s.Message // the failure reports the refusal
	case s.Stage == SagaCompensating && step == StepCompensate:
		return SagaMarker{}, fmt.Errorf("domain: compensation of %s %q on %s refused: %s: %s", s.Command, s.Key, s.Out, o.Code, o.Message)
	default:
		return SagaMarker{}, fmt.Errorf("domain: step %s (applied %v) does not follow stage %s of %q", step, o.Applied, s.Stage, s.Key)
	}
	if !o.Applied && o.Code == "" {
		return SagaMarker{}, fmt.Errorf("domain: refused step %s of %q without a code", step, s.Key)
	}
	var data any
	if s.Refund {
		switch m.typ {
		case EvTransferRejected:
			m.typ, data = EvRefundRejected, RefundRejected{RefundKey: s.Key, Code: o.Code, Message: o.Message}
		case EvTransferCreditRefused:
			m.typ, data = EvRefundCreditRefused, RefundCreditRefused{RefundKey: s.Key, Code: o.Code, Message: o.Message}
		case EvTransferCompleted:
			m.typ, data = EvRefundCompleted, RefundCompleted{RefundKey: s.Key, Amount: s.Amount}
		case EvTransferFailed:
			m.typ, data = EvRefundFailed, RefundFailed{RefundKey: s.Key, Code: o.Code, Message: o.Message}
		}
	} else {
		switch m.typ {
		case EvTransferRejected:
			data = TransferRejected{TransferID: t.ID, Code: o.Code, Message: o.Message}
		case EvTransferCreditRefused:
			data = TransferCreditRefused{TransferID: t.ID, Code: o.Code, Message: o.Message, Moved: s.movedIfUpTo()}
		case EvTransferCompleted:
			data = TransferCompleted{TransferID: t.ID, Amount: s.Amount}
		case EvTransferFailed:
			data = TransferFailed{TransferID: t.ID, Code: o.Code, Message: o.Message}
		}
	}
	return SagaMarker{Key: StepKey(s.Key, m.step), Events: []NewEvent{{m.typ, data}}}, nil
}

// EvolveTransfer applies a stored event to the transfer, in place. Events must
// come in stream order; a gap, a foreign event or a marker that does not follow
// its saga's stage is an error (the caller's invariant broke).
func EvolveTransfer(t *Transfer, ev StoredEvent) error {
	payload, err := DecodeEvent(ev.Type, ev.Data)
	return EvolveTransferDecoded(t, ev, payload, err)
}

// EvolveTransferDecoded is EvolveTransfer for an event its reader has decoded:
// payload and decodeErr are what DecodeEvent(ev.Type, ev.Data) returned (the
// audit decodes its events beside the fold, the rebuild's check takes what the
// build decoded), folded as EvolveTransfer folds them, with its errors.
func EvolveTransferDecoded(t *Transfer, ev StoredEvent, payload any, decodeErr error) error {
	if int64(ev.Revision) != t.Revision+1 {
		return fmt.Errorf("domain: %s: event at revision %d after revision %d", ev.Stream, ev.Revision, t.Revision)
	}
	if decodeErr != nil {
		return decodeErr
	}
	e, ok := payload.(TransferEvent)
	if !ok {
		return fmt.Errorf("domain: %s@%d: event %T does not belong to a transfer stream", ev.Stream, ev.Revision, payload)
	}
	s, err := e.foldTransfer(t, ev.Metadata)
	if err != nil {
		return fmt.Errorf("domain: %s@%d: %w", ev.Stream, ev.Revision, err)
	}
	t.Revision = int64(ev.Revision)
	t.LastChain = ev.Metadata.Chain
	s.Events = append(s.Events, EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type})
	if ev.Position != "" {
		s.Position = ev.Position
	}
	return nil
}

// openSaga records the transfer's request, once, and opens its saga, pending.
func (t *Transfer) openSaga(e *TransferRequested, m Metadata) (*Saga, error) {
	if t.Requested {
		return nil, fmt.Errorf("transfer %s requested twice", t.ID)
	}
	if e.Amount <= 0 {
		return nil, fmt.Errorf("transfer %s of %d", t.ID, e.Amount)
	}
	t.Requested, t.From, t.To, t.Amount, t.Currency = true, e.From, e.To, e.Amount, e.Currency
	t.Saga = &Saga{
		Key: m.Key, Command: CommandType(m.Command), RequestHash: ParseHash(m.RequestHash), Request: m.Request,
		Out: e.From, In: e.To, Amount: e.Amount, Currency: e.Currency, Stage: SagaPending, At: m.At, Metadata: e.Metadata, UpTo: e.UpTo,
		EffectiveAt: effectiveOf(m),
	}
	return t.Saga, nil
}

// reserveRefund opens the saga of a refund of the completed transfer, pending,
// and reserves its amount, which must fit what is still refundable.
func (t *Transfer) reserveRefund(e *TransferRefundRequested, m Metadata) (*Saga, error) {
	if t.Saga == nil || t.Saga.Stage != SagaCompleted {
		return nil, fmt.Errorf("refund %q of a transfer that is not completed", e.RefundKey)
	}
	if _, dup := t.Refunds[e.RefundKey]; dup || e.Amount <= 0 || e.Amount > t.Refundable() {
		return nil, fmt.Errorf("refund %q of %d does not fit the %d refundable", e.RefundKey, e.Amount, t.Refundable())
	}
	s := t.newRefund(e.RefundKey, m)
	s.Amount, s.Metadata = e.Amount, e.Metadata
	t.Reserved += e.Amount
	return s, nil
}

// rejectRefund rejects a pending refund, or records a refund refused outright
// (then the rejection is the refund's only event and it reserved nothing).
func (t *Transfer) rejectRefund(e *RefundRejected, m Metadata) (*Saga, error) {
	s, ok := t.Refunds[e.RefundKey]
	if !ok {
		s = t.newRefund(e.RefundKey, m)
		s.Stage, s.Code, s.Message, s.Outright = SagaRejected, e.Code, e.Message, true
		return s, nil
	}
	return s, t.advance(s, SagaPending, SagaRejected, e.Code, e.Message)
}

// advanceRefund moves the refund of key from stage from to stage to, as advance
// does; an error when that refund was never requested.
func (t *Transfer) advanceRefund(key string, from, to SagaStage, code Code, msg string) (*Saga, error) {
	s, ok := t.Refunds[key]
	if !ok {
		return nil, fmt.Errorf("refund %q was never requested", key)
	}
	return s, t.advance(s, from, to, code, msg)
}

func (t *Transfer) newRefund(key string, m Metadata) *Saga {
	s := &Saga{
		Key: key, Command: CommandType(m.Command), RequestHash: ParseHash(m.RequestHash), Request: m.Request, Refund: true,
		Out: t.To, In: t.From, Currency: t.Currency, Stage: SagaPending, At: m.At, EffectiveAt: effectiveOf(m),
	}
	t.Refunds[key] = s
	t.RefundOrder = append(t.RefundOrder, key)
	return s
}

// advance moves saga s from stage from to stage to; a refund that ends without
// moving money releases its reservation.
func (t *Transfer) advance(s *Saga, from, to SagaStage, code Code, msg string) error {
	if s == nil {
		return fmt.Errorf("marker before the transfer was requested")
	}
	if s.Stage != from {
		return fmt.Errorf("saga %q cannot move from stage %s to %s", s.Key, s.Stage, to)
	}
	s.Stage, s.Code, s.Message = to, code, msg
	if s.Refund && (to == SagaRejected || to == SagaFailed) {
		t.Reserved -= s.Amount
	}
	return nil
}

// SagaReplyEvents orders the events of a decided saga's reply: the saga's own
// events in the transfer stream, each marker preceded by the events of the step
// records it concludes (the debit before a rejection or completion, the credit
// before a completion or a refused credit, the compensation before a failure).
// The ledger, the commands read model and the audit all build replies with it, so
// a reply rebuilt from the events is byte for byte the one the ledger sent.
func SagaReplyEvents(saga, debit, credit, compensate []EventRef) []EventRef {
	out := []EventRef{}
	add := func(step *[]EventRef) {
		out = append(out, (*step)...)
		*step = nil // once
	}
	for _, ev := range saga {
		switch ev.Type {
		case EvTransferRejected, EvRefundRejected:
			add(&debit)
		case EvTransferCompleted, EvRefundCompleted, EvTransferCreditRefused, EvRefundCreditRefused:
			add(&debit)
			add(&credit)
		case EvTransferFailed, EvRefundFailed:
			add(&compensate)
		}
		out = append(out, ev)
	}
	return out
}

// AtomicTransfer is a saga of a transfer stream (the transfer's, or a refund's)
// decided at once over both its accounts (a store that appends to several
// streams in one write): the step commands and their decisions (Credit is
// empty when the debit is refused) and the marker that decides the saga,
// exactly as the saga would write them on its way to the same outcome.
type AtomicTransfer struct {
	DebitCmd, CreditCmd Command
	Debit, Credit       Decision
	// Invalid: the saga's effective_at is refused on one of the accounts
	// (Account.CheckEffective); nothing else is decided.
	Invalid   *InvalidError
	MarkerKey string
	Marker    []NewEvent
}

// DecideTransferAtomically decides saga s of t (just requested) on the account
// it debits (out, s.Out: a transfer's source, a refund's the transfer's
// destination) and the one it credits (in, s.In) at time at: the debit, then
// the credit on what the debit leaves; a credit that in refuses refuses the
// debit (recorded on out, with in's code), so nothing leaves out. Neither
// account is changed.
func DecideTransferAtomically(t *Transfer, s *Saga, out, in *Account, at time.Time) (AtomicTransfer, error) {
	d := AtomicTransfer{DebitCmd: t.StepCommand(s, StepDebit, at), CreditCmd: t.StepCommand(s, StepCredit, at)}
	for _, a := range []*Account{out, in} {
		if d.Invalid = a.CheckEffective(d.DebitCmd); d.Invalid != nil {
			return d, nil
		}
	}
	d.Debit = DecideAccount(out, d.DebitCmd)
	step, outcome := StepDebit, StepOutcome{}
	switch {
	case len(d.Debit.Events) == 0:
		return AtomicTransfer{}, fmt.Errorf("domain: debit of %s refused without a record: %s", out.ID, d.Debit.Rejection.Code)
	case d.Debit.Rejection != nil:
		outcome = StepOutcome{Code: d.Debit.Rejection.Code, Message: d.Debit.Rejection.Message}
	default:
		moved, err := s.Moving(StepOutcome{Applied: true, Moved: debitMoved(d.Debit)})
		if err != nil {
			return AtomicTransfer{}, err
		}
		s, d.CreditCmd = moved, t.StepCommand(moved, StepCredit, at)
		d.Credit = DecideAccount(in, d.CreditCmd)
		if r := d.Credit.Rejection; r != nil {
			d.Debit, d.Credit = RefuseStep(out, d.DebitCmd, r.Code, r.Message), Decision{}
			outcome = StepOutcome{Code: r.Code, Message: r.Message}
		} else {
			step, outcome = StepCredit, StepOutcome{Applied: true}
		}
	}
	m, err := DecideSagaMarker(t, s, step, outcome)
	d.MarkerKey, d.Marker = m.Key, m.Events
	return d, err
}

// movedIfUpTo is what the debit of a saga with up_to moved (its Amount once
// Moving), 0 for another saga: what its TransferCreditRefused records.
func (s *Saga) movedIfUpTo() int64 {
	if !s.UpTo {
		return 0
	}
	return s.Amount
}

// debitMoved is what an applied debit with up_to moved, 0 for another decision.
func debitMoved(d Decision) int64 {
	if len(d.Events) != 1 {
		return 0
	}
	if e, ok := d.Events[0].Data.(Debited); ok && e.Requested != nil {
		return e.Amount
	}
	return 0
}
