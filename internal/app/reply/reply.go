// Package reply is the wire reply of a command (PROTOCOL.md §3) and the one place
// that builds it. The command service answers with it, the read models store it
// for ledger.v1.query.command, and the audit rebuilds it from the events alone to
// check both; all three call these functions, so there is one answer to "what did
// this key reply". It imports only domain.
package reply

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/ledgerworks/ledger/domain"
)

// TransferView is the transfer as a reply shows it.
type TransferView struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
}

// TransactionView is the reply's transaction (PROTOCOL.md v1.1 §2.1).
type TransactionView struct {
	TransactionID string `json:"transaction_id"`
	Status        string `json:"status"`
}

// Reply is the answer to a command (PROTOCOL.md §3).
type Reply struct {
	Status         domain.Status       `json:"status"`
	Code           domain.Code         `json:"code"`
	Message        string              `json:"message"`
	IdempotencyKey string              `json:"idempotency_key"`
	Duplicate      bool                `json:"duplicate"`
	Fields         []string            `json:"fields,omitempty"`
	Events         []domain.EventRef   `json:"events"`
	Account        *domain.AccountView `json:"account,omitempty"`
	Transfer       *TransferView       `json:"transfer,omitempty"`
	// Transaction, Accounts and Posting answer post_transaction (v1.1): the
	// transaction's status, every account it touched as it left them (ordered by
	// account_id), and for a refusal the index of the refusing posting.
	Transaction *TransactionView     `json:"transaction,omitempty"`
	Accounts    []domain.AccountView `json:"accounts,omitempty"`
	Posting     *int                 `json:"posting,omitempty"`
	// Moved answers a withdraw or transfer with up_to (v1.2 §2.3) that
	// applied: the amount that moved.
	Moved *int64 `json:"moved,omitempty"`
	// Position is the global position of the command's last event (an extension):
	// pass it as min_position to a query to read your own write.
	Position string `json:"position,omitempty"`
	// Replies and Index answer a batch (v1.2 §2.2): one reply per command, in
	// the batch's order; for a refused atomic batch, the index of the command
	// that refused it.
	Replies []Reply `json:"replies,omitempty"`
	Index   *int    `json:"index,omitempty"`
}

// Invalid answers a malformed request: nothing is recorded.
func Invalid(key string, err *domain.InvalidError) Reply {
	r := Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: err.Error(), IdempotencyKey: key, Events: []domain.EventRef{}}
	if err.Field != "" {
		r.Fields = []string{err.Field}
	}
	return r
}

// Error answers an infrastructure failure: the outcome is unknown, the client
// retries with the same key.
func Error(key string, err error) Reply {
	return Reply{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "infrastructure failure, retry with the same key: " + err.Error(), IdempotencyKey: key, Events: []domain.EventRef{}}
}

// Conflict answers a key used with a different request, naming the fields that differ.
func Conflict(key string, fields []string) Reply {
	return Reply{
		Status: domain.StatusInvalid, Code: domain.CodeIdempotencyKeyConflict, IdempotencyKey: key, Fields: fields,
		Message: "idempotency key was used with a different request; differing fields: " + strings.Join(fields, ", "),
		Events:  []domain.EventRef{},
	}
}

// NotRecorded answers a refusal that was not written (nothing exists to record it in).
func NotRecorded(key string, r *domain.Rejection) Reply {
	return Reply{Status: domain.StatusRejected, Code: r.Code, Message: r.Message, IdempotencyKey: key, Events: []domain.EventRef{}}
}

// Account is the reply of a key an account stream decided, the same for the first
// answer and every duplicate but for the duplicate flag. It shares events and
// after with the reply: callers pass values they own (copies out of any cache).
func Account(rec *domain.KeyRecord, events []domain.EventRef, after *domain.AccountView, duplicate bool) Reply {
	if events == nil {
		events = []domain.EventRef{}
	}
	r := Reply{
		Status: rec.Status, Code: rec.Code, Message: rec.Message, IdempotencyKey: rec.Key,
		Duplicate: duplicate, Events: events, Account: after, Position: rec.Position,
	}
	if moved, ok := rec.Moved(); ok {
		r.Moved = &moved
	}
	return r
}

// Transaction is the reply of a key a transaction stream decided, from its one
// event (ref, with its payload: *domain.TransactionPosted or
// *domain.TransactionRejected), the same for the first answer and every
// duplicate but for the duplicate flag; position is the event's.
func Transaction(key string, ref domain.EventRef, payload any, position string, duplicate bool) (Reply, error) {
	r := Reply{IdempotencyKey: key, Duplicate: duplicate, Position: position, Events: []domain.EventRef{ref}}
	switch p := payload.(type) {
	case *domain.TransactionPosted:
		r.Status, r.Code = domain.StatusApplied, domain.CodeOK
		r.Events = append(r.Events, p.Legs...)
		r.Transaction = &TransactionView{TransactionID: p.TransactionID, Status: domain.TransactionPostedStatus}
		r.Accounts = p.Accounts
	case *domain.TransactionRejected:
		r.Status, r.Code, r.Message = domain.StatusRejected, p.Code, p.Message
		r.Transaction = &TransactionView{TransactionID: p.TransactionID, Status: domain.TransactionRejectedStatus}
		r.Accounts, r.Posting = p.Accounts, &p.Posting
	default:
		return Reply{}, fmt.Errorf("reply: %s@%d holds %T, not a transaction's outcome", ref.Stream, ref.Revision, payload)
	}
	return r, nil
}

// TransactionDetail answers ledger.v1.query.transaction (PROTOCOL.md v1.1 §4):
// the transaction as its stream records it; for a refused one, the code, the
// message and the refusing posting (an extension), and the accounts as it left
// them (also an extension).
type TransactionDetail struct {
	TransactionID  string               `json:"transaction_id"`
	Status         string               `json:"status"`
	Postings       []domain.Posting     `json:"postings"`
	Metadata       map[string]string    `json:"metadata"`
	IdempotencyKey string               `json:"idempotency_key"`
	Code           domain.Code          `json:"code,omitempty"`
	Message        string               `json:"message,omitempty"`
	Posting        *int                 `json:"posting,omitempty"`
	Accounts       []domain.AccountView `json:"accounts"`
	Position       string               `json:"position"`
}

// TransactionDetailOf is the detail of a transaction from its stream's one
// event (key, payload as DecodeEvent gives it, position).
func TransactionDetailOf(key string, payload any, position string) (TransactionDetail, error) {
	d := TransactionDetail{IdempotencyKey: key, Position: position, Metadata: map[string]string{}}
	var md map[string]string
	switch p := payload.(type) {
	case *domain.TransactionPosted:
		d.TransactionID, d.Status, d.Postings, d.Accounts, md = p.TransactionID, domain.TransactionPostedStatus, p.Postings, p.Accounts, p.Metadata
	case *domain.TransactionRejected:
		d.TransactionID, d.Status, d.Postings, d.Accounts, md = p.TransactionID, domain.TransactionRejectedStatus, p.Postings, p.Accounts, p.Metadata
		d.Code, d.Message, d.Posting = p.Code, p.Message, &p.Posting
	default:
		return TransactionDetail{}, fmt.Errorf("reply: %T is not a transaction's outcome", payload)
	}
	for k, v := range md {
		d.Metadata[k] = v
	}
	return d, nil
}

// TransactionNotRecorded answers a transaction refused without record (an
// account that does not exist), naming the posting.
func TransactionNotRecorded(key, transactionID string, r *domain.Rejection, posting int) Reply {
	out := NotRecorded(key, r)
	out.Transaction = &TransactionView{TransactionID: transactionID, Status: domain.TransactionRejectedStatus}
	out.Posting = &posting
	return out
}

// Saga is a decided transfer or refund saga as a reply needs it.
type Saga struct {
	Key            string // the client key of the saga
	TransferID     string
	TransferStatus string // the transfer's status (domain.SagaStage.Status of the transfer's own saga)
	Stage          domain.SagaStage
	Code           domain.Code
	Message        string
	// Out and In name the accounts of the debit and the credit steps.
	Out, In string
	// Outright: refused before any account step ran.
	Outright bool
	// Moved is what a completed transfer with up_to moved (v1.2 §2.3), nil
	// for any other saga.
	Moved *int64
	// Events are the saga's own events in the transfer stream, in order.
	Events   []domain.EventRef
	Position string
}

// Step is an account step of a saga as a reply needs it; nil for a step that never ran.
type Step struct {
	Status domain.Status
	Events []domain.EventRef
	// After is the account right after the step (nil when unknown).
	After *domain.AccountView
}

// StepLookup finds the record of a saga step by its derived key (domain.StepKey);
// it returns nil for a step that never ran. The command service reads the
// account, the read models their rows, the audit its fold.
type StepLookup func(account, stepKey string) (*Step, error)

// FromSaga is the reply of a decided saga, the same for the first answer and every
// duplicate but for the duplicate flag. Its events are every event the saga wrote,
// in the order the saga wrote them: the request, the debit, the credit or the
// refusal, the compensation, each followed by the marker that recorded it. The
// account is the one the money left (the transfer's source, a refund's
// destination), right after the saga's last step on it.
func FromSaga(sg Saga, duplicate bool, lookup StepLookup) (Reply, error) {
	r := Reply{
		Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: sg.Key, Duplicate: duplicate,
		Events: []domain.EventRef{}, Transfer: &TransferView{TransferID: sg.TransferID, Status: sg.TransferStatus}, Position: sg.Position,
	}
	if sg.Stage != domain.SagaCompleted {
		r.Status, r.Code, r.Message = domain.StatusRejected, sg.Code, sg.Message
	} else {
		r.Moved = sg.Moved
	}
	var debit, credit, compensate *Step
	if !sg.Outright {
		var err error
		if debit, err = lookup(sg.Out, domain.StepKey(sg.Key, domain.StepDebit)); err != nil {
			return Reply{}, err
		}
		if debit != nil && debit.Status == domain.StatusApplied {
			if credit, err = lookup(sg.In, domain.StepKey(sg.Key, domain.StepCredit)); err != nil {
				return Reply{}, err
			}
		}
		if sg.Stage == domain.SagaFailed {
			if compensate, err = lookup(sg.Out, domain.StepKey(sg.Key, domain.StepCompensate)); err != nil {
				return Reply{}, err
			}
		}
	}
	last := debit
	if compensate != nil {
		last = compensate
	}
	r.Events = domain.SagaReplyEvents(sg.Events, debit.events(), credit.events(), compensate.events())
	if last != nil && last.After != nil {
		after := *last.After
		r.Account = &after
	}
	return r, nil
}

// events is the step's events, none for a step that never ran.
func (s *Step) events() []domain.EventRef {
	if s == nil {
		return nil
	}
	return s.Events
}

// StepOf is the Step of an account's key record (nil for nil).
func StepOf(rec *domain.KeyRecord) *Step {
	if rec == nil {
		return nil
	}
	after := rec.After()
	return &Step{Status: rec.Status, Events: rec.Events, After: &after}
}

// SagaOf is a domain saga of transfer t as a reply needs it.
func SagaOf(t *domain.Transfer, sg *domain.Saga) Saga {
	r := Saga{
		Key: sg.Key, TransferID: t.ID, TransferStatus: t.Saga.Stage.Status(), Stage: sg.Stage, Code: sg.Code, Message: sg.Message,
		Out: sg.Out, In: sg.In, Outright: sg.Outright, Events: sg.Events, Position: sg.Position,
	}
	if sg.UpTo && sg.Stage == domain.SagaCompleted {
		moved := sg.Amount
		r.Moved = &moved
	}
	return r
}

// Batch answers a batch that is not atomic (PROTOCOL.md v1.2 §2.2): applied,
// whatever its commands got, with their replies in order.
func Batch(replies []Reply) Reply {
	return Reply{Status: domain.StatusApplied, Code: domain.CodeOK, Events: []domain.EventRef{}, Replies: replies}
}

// Undecided reports whether r leaves a command without a definite answer:
// status error, or a batch holding such a reply. A JetStream message answered
// so is delivered again (the keys make that safe).
func Undecided(r Reply) bool {
	if r.Status == domain.StatusError {
		return true
	}
	for i := range r.Replies {
		if r.Replies[i].Status == domain.StatusError {
			return true
		}
	}
	return false
}

// Recorded reports whether r answers a decision recorded under its key, which
// answers the same forever (duplicate when sent again): applied or rejected,
// or an atomic batch refused at one of its elements (its Index), whether that
// element was rejected or invalid (PROTOCOL.md v1.2 §2.2). A request invalid
// as a whole records nothing (§3), and an error is no answer.
func Recorded(r Reply) bool {
	switch r.Status {
	case domain.StatusApplied, domain.StatusRejected:
		return true
	case domain.StatusInvalid:
		return r.Index != nil
	}
	return false
}

// Bounds of a reply's size on the wire, for a batch's (PROTOCOL.md v1.2 §2.2:
// a batch whose reply could not fit a NATS message is refused before anything
// is decided). A command's reply holds at most a few events, one account, a
// transfer and a message of bounded IDs and codes: under replyBytesPerCommand
// (natsapi.TestBatchReplyBound encodes the largest replies of the commands); a
// transaction adds, per posting, two legs' events and two accounts.
const (
	replyBytesPerCommand = 4 << 10
	replyBytesPerPosting = 1 << 10
	replyBytesOfBatch    = 512
)

// MaxBatchReplyBytes bounds the wire size of the reply to a batch of commands
// commands holding postings postings in all.
func MaxBatchReplyBytes(commands, postings int) int {
	return replyBytesOfBatch + commands*replyBytesPerCommand + postings*replyBytesPerPosting
}

// AtomicRefused answers an atomic batch (PROTOCOL.md v1.2 §2.2) that its
// element index refused: the batch takes that element's status and code, the
// element its own reply (elem), every other element rejected with
// linked_event_failed; keys are the elements' keys, in order.
func AtomicRefused(key string, keys []string, index int, elem Reply, duplicate bool) Reply {
	replies := make([]Reply, len(keys))
	linked := fmt.Sprintf("not applied: command %d of the atomic batch was refused", index)
	for i, k := range keys {
		replies[i] = Reply{Status: domain.StatusRejected, Code: domain.CodeLinkedEventFailed, Message: linked, IdempotencyKey: k, Events: []domain.EventRef{}}
	}
	replies[index] = elem
	return Reply{
		Status: elem.Status, Code: elem.Code, Message: fmt.Sprintf("command %d of the atomic batch: %s", index, elem.Message),
		IdempotencyKey: key, Duplicate: duplicate, Events: []domain.EventRef{}, Replies: replies, Index: &index,
	}
}

// AtomicApplied answers an atomic batch that applied, with its elements'
// replies in order.
func AtomicApplied(key string, replies []Reply, duplicate bool) Reply {
	return Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: key, Duplicate: duplicate, Events: []domain.EventRef{}, Replies: replies}
}

// BatchDecided is the reply an atomic batch's decision (d) records: refused,
// the whole reply (AtomicRefused, the refusing element's as d holds it);
// applied, the batch with one stub per element (its key, and duplicate when
// the batch answered it as one), which FillBatch fills with the elements'
// replies. The ledger, the commands read model and the audit build it here.
func BatchDecided(d *domain.BatchDecided) (Reply, error) {
	if d.Status != domain.StatusApplied {
		if d.Index == nil || *d.Index < 0 || *d.Index >= len(d.Keys) {
			return Reply{}, fmt.Errorf("reply: batch %q: its decision names no refusing element", d.Key)
		}
		var elem Reply
		if err := json.Unmarshal(d.Reply, &elem); err != nil {
			return Reply{}, fmt.Errorf("reply: batch %q: its refusing element's reply: %w", d.Key, err)
		}
		if err := refusedBy(d, elem); err != nil {
			return Reply{}, err
		}
		return AtomicRefused(d.Key, d.Keys, *d.Index, elem, false), nil
	}
	stubs := make([]Reply, len(d.Keys))
	for i, k := range d.Keys {
		stubs[i] = Reply{IdempotencyKey: k, Duplicate: slices.Contains(d.Duplicates, i)}
	}
	return AtomicApplied(d.Key, stubs, false), nil
}

// refusedBy checks a refused batch's decision (d) against the reply of the
// element it names (elem): the decision's status and code are that
// element's, a refusal (rejected, or invalid: PROTOCOL.md v1.2 §2.2), under
// that element's key.
func refusedBy(d *domain.BatchDecided, elem Reply) error {
	i := *d.Index
	switch {
	case elem.Status != domain.StatusRejected && elem.Status != domain.StatusInvalid:
		return fmt.Errorf("reply: batch %q: decided %s, its element %d answered %s, not a refusal", d.Key, d.Status, i, elem.Status)
	case elem.Status != d.Status || elem.Code != d.Code:
		return fmt.Errorf("reply: batch %q: decided %s %s, its element %d answered %s %s", d.Key, d.Status, d.Code, i, elem.Status, elem.Code)
	case elem.IdempotencyKey != d.Keys[i]:
		return fmt.Errorf("reply: batch %q: its element %d has key %q, its reply %q", d.Key, i, d.Keys[i], elem.IdempotencyKey)
	}
	return nil
}

// FillBatch fills an applied batch's stubs (BatchDecided) with its elements'
// replies (elem: a key's original reply, found reports whether it has one),
// each marked duplicate as its stub says, or every one when duplicate (the
// whole batch answered again).
func FillBatch(batch Reply, duplicate bool, elem func(key string) (*Reply, error)) (Reply, error) {
	if batch.Status != domain.StatusApplied {
		batch.Duplicate = duplicate
		return batch, nil
	}
	replies := make([]Reply, len(batch.Replies))
	for i, stub := range batch.Replies {
		found, err := elem(stub.IdempotencyKey)
		if err != nil {
			return Reply{}, err
		}
		if found == nil {
			return Reply{}, fmt.Errorf("reply: batch %q: the decision of its element %d (key %q) is not found", batch.IdempotencyKey, i, stub.IdempotencyKey)
		}
		r := *found
		r.Duplicate = duplicate || stub.Duplicate
		replies[i] = r
	}
	return AtomicApplied(batch.IdempotencyKey, replies, duplicate), nil
}
