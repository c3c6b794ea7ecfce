package domain

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestEventRegistryListsEveryEventType: every event type constant of the
// package (Ev..., read from its source) is registered, and nothing else is, so
// that an event the domain writes is never one DecodeEvent does not know.
func TestEventRegistryListsEveryEventType(t *testing.T) {
	consts := eventTypeConstants(t)
	if len(consts) < 20 {
		t.Fatalf("found only %d event type constants: %v", len(consts), consts)
	}
	for name, value := range consts {
		if et, ok := LookupEventType(value); !ok || et.Name != value {
			t.Errorf("%s (%q) is not in the event registry (domain/registry.go, eventTypes)", name, value)
		}
	}
	values := map[string]bool{}
	for _, v := range consts {
		values[v] = true
	}
	for _, et := range EventTypes() {
		if !values[et.Name] {
			t.Errorf("registered event type %q has no Ev constant", et.Name)
		}
	}
}

// eventTypeConstants reads the package's non-test source: every constant whose
// name starts with Ev and whose value is a string literal, by name.
func eventTypeConstants(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]string{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "Ev") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out[id.Name] = v
				}
			}
			return true
		})
	}
	return out
}

// registrySamples has, for every registered event type, a stream of its kind
// that ends with an event of that type, each event allowed where it stands.
func registrySamples() map[string][]NewEvent {
	z := ptr(0)
	opened := NewEvent{EvAccountOpened, AccountOpened{AccountID: "a", Currency: "EUR", OverdraftLimit: 50, Metadata: map[string]string{"o": "p"}}}
	credited := NewEvent{EvCredited, Credited{Amount: 100, Currency: "EUR", Reason: ReasonDeposit, BalanceAfter: 100, HeldAfter: z}}
	expires := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	placed := NewEvent{EvHoldPlaced, HoldPlaced{HoldID: "h", Amount: 5, Currency: "EUR", ExpiresAt: &expires, HeldAfter: 5, BalanceAfter: ptr(100)}}
	requested := NewEvent{EvTransferRequested, TransferRequested{TransferID: "t", From: "a", To: "b", Amount: 10, Currency: "EUR"}}
	completed := NewEvent{EvTransferCompleted, TransferCompleted{TransferID: "t", Amount: 10}}
	refund := NewEvent{EvTransferRefundRequested, TransferRefundRequested{RefundKey: "r", Amount: 4}}
	creditRefused := NewEvent{EvRefundCreditRefused, RefundCreditRefused{RefundKey: "r", Code: CodeAccountClosed, Message: "closed"}}
	postings := []Posting{{From: "a", To: "b", Amount: 3, Currency: "EUR"}}
	views := []AccountView{{AccountID: "a", Currency: "EUR", Balance: -3, Available: -3, Revision: 1}, {AccountID: "b", Currency: "EUR", Balance: 3, Available: 3, Revision: 1}}
	txRequested := NewEvent{EvTransactionRequested, TransactionRequested{TransactionID: "x", Postings: postings}}
	return map[string][]NewEvent{
		EvAccountOpened: {opened},
		EvCredited:      {opened, credited},
		EvDebited:       {opened, {EvDebited, Debited{Amount: 30, Currency: "EUR", Reason: ReasonRefund, Ref: "k", BalanceAfter: -30, HeldAfter: z}}},
		EvHoldPlaced:    {opened, credited, placed},
		EvHoldCaptured:  {opened, credited, placed, {EvHoldCaptured, HoldCaptured{HoldID: "h", Amount: 3, Released: 2, Currency: "EUR", BalanceAfter: 97, To: "b"}}},
		EvHoldReleased:  {opened, credited, placed, {EvHoldReleased, HoldReleased{HoldID: "h", Amount: 5, Reason: ReasonHoldExpired, BalanceAfter: ptr(100)}}},
		EvAccountClosed: {opened, {EvAccountClosed, AccountClosed{AccountID: "a"}}},
		EvCommandRejected: {opened, {EvCommandRejected, CommandRejected{Command: string(CmdWithdraw), Code: CodeInsufficientFunds,
			Message: "no", BalanceAfter: z, HeldAfter: z}}},

		EvTransferRequested:       {requested},
		EvTransferRejected:        {requested, {EvTransferRejected, TransferRejected{TransferID: "t", Code: CodeInsufficientFunds, Message: "no"}}},
		EvTransferCreditRefused:   {requested, {EvTransferCreditRefused, TransferCreditRefused{TransferID: "t", Code: CodeAccountClosed, Message: "closed"}}},
		EvTransferCompleted:       {requested, completed},
		EvTransferFailed:          {requested, {EvTransferCreditRefused, TransferCreditRefused{TransferID: "t", Code: CodeAccountClosed}}, {EvTransferFailed, TransferFailed{TransferID: "t", Code: CodeAccountClosed}}},
		EvTransferRefundRequested: {requested, completed, refund},
		EvRefundRejected:          {requested, completed, refund, {EvRefundRejected, RefundRejected{RefundKey: "r", Code: CodeInsufficientFunds, Message: "no"}}},
		EvRefundCreditRefused:     {requested, completed, refund, creditRefused},
		EvRefundCompleted:         {requested, completed, refund, {EvRefundCompleted, RefundCompleted{RefundKey: "r", Amount: 4}}},
		EvRefundFailed:            {requested, completed, refund, creditRefused, {EvRefundFailed, RefundFailed{RefundKey: "r", Code: CodeAccountClosed}}},

		EvTransactionRequested:          {txRequested},
		EvTransactionReserved:           {txRequested, {EvTransactionReserved, TransactionReserved{TransactionID: "x"}}},
		EvTransactionReservationRefused: {txRequested, {EvTransactionReservationRefused, TransactionReservationRefused{TransactionID: "x", Account: "a", Code: CodeInsufficientFunds, Message: "no"}}},
		EvTransactionPosted: {{EvTransactionPosted, TransactionPosted{TransactionID: "x", Postings: postings, Accounts: views,
			Legs: []EventRef{{ID: uuid.New(), Stream: "account-a", Revision: 1, Type: EvDebited}}}}},
		EvTransactionRejected: {{EvTransactionRejected, TransactionRejected{TransactionID: "x", Postings: postings, Code: CodeAccountClosed, Message: "closed", Accounts: views}}},

		EvKeyClaimed: {{EvKeyClaimed, KeyClaimed{Key: "k", Command: string(CmdDeposit), RequestHash: "ab", Request: json.RawMessage(`{"a":1}`), Stream: "account-a", Revision: new(uint64)}}},
		EvBatchDecided: {{EvBatchDecided, BatchDecided{KeyClaimed: KeyClaimed{Key: "b", Command: string(CmdBatch), RequestHash: "ab", Request: json.RawMessage(`{"a":1}`), Stream: "key-b", Revision: new(uint64)},
			Status: StatusApplied, Code: CodeOK, Keys: []string{"k"}}}},
	}
}

// registryFolds folds a stored event into a new aggregate of each kind, which
// folded prior first: the error of each (nil when it folded).
type registryFolds map[StreamKind]func(prior []StoredEvent, ev StoredEvent) error

func newRegistryFolds() registryFolds {
	return registryFolds{
		StreamAccount:     foldsInto(func() *Account { return NewAccount("a") }, EvolveAccount),
		StreamTransfer:    foldsInto(func() *Transfer { return NewTransfer("t") }, EvolveTransfer),
		StreamTransaction: foldsInto(func() *TransactionSaga { return NewTransactionSaga("x") }, EvolveTransactionSaga),
	}
}

// foldsInto folds prior, then ev, into a new aggregate by evolve.
func foldsInto[S any](newAggregate func() S, evolve func(S, StoredEvent) error) func([]StoredEvent, StoredEvent) error {
	return func(prior []StoredEvent, ev StoredEvent) error {
		s := newAggregate()
		for _, p := range prior {
			if err := evolve(s, p); err != nil {
				return err
			}
		}
		return evolve(s, ev)
	}
}

// TestEventRegistry walks every registered event type: its data decodes to
// its payload type and back to what was encoded; it folds into an aggregate of
// its kind, and into no other; an account event folds the same from its
// decided value, and states the account it leaves as the fold has it.
func TestEventRegistry(t *testing.T) {
	samples := registrySamples()
	folds := newRegistryFolds()
	for _, et := range EventTypes() {
		evs, ok := samples[et.Name]
		if !ok || evs[len(evs)-1].Type != et.Name {
			t.Errorf("%s: no sample in registrySamples: add one", et.Name)
			continue
		}
		stored := registryStored(t, evs)
		last := stored[len(stored)-1]
		payload, err := DecodeEvent(et.Name, last.Data)
		if err != nil {
			t.Fatalf("%s: %v", et.Name, err)
		}
		if reflect.TypeOf(payload) != reflect.TypeOf(et.New()) || !reflect.DeepEqual(reflect.ValueOf(payload).Elem().Interface(), evs[len(evs)-1].Data) {
			t.Errorf("%s: decoded %#v, encoded %#v", et.Name, payload, evs[len(evs)-1].Data)
		}
		for kind, fold := range folds {
			err := fold(stored[:len(stored)-1], last)
			if kind == et.Kind && err != nil {
				t.Errorf("%s does not fold into its %s stream: %v", et.Name, kind, err)
			}
			if kind != et.Kind && (err == nil || !strings.Contains(err.Error(), "does not belong")) {
				t.Errorf("%s folds into a %s stream: %v", et.Name, kind, err)
			}
		}
		if et.Kind == StreamAccount {
			checkAccountEvent(t, stored, evs)
		}
	}
	for name := range samples {
		if _, ok := LookupEventType(name); !ok {
			t.Errorf("sample of %s, which is not registered", name)
		}
	}
}

// checkAccountEvent folds an account stream from its stored data and from its
// decided payloads, requires the same aggregate, the status the last event's
// change names (if any) to be the folded account's, and its stated account
// (AfterOf) to be the fold's.
func checkAccountEvent(t *testing.T, stored []StoredEvent, evs []NewEvent) {
	t.Helper()
	fromData, fromDecided := NewAccount("a"), NewAccount("a")
	for i, ev := range stored {
		if err := EvolveAccount(fromData, ev); err != nil {
			t.Fatal(err)
		}
		if err := EvolveAccountDecided(fromDecided, ev, evs[i].Data); err != nil {
			t.Fatal(err)
		}
	}
	fromDecided.ForgetDurable(fromDecided.Revision)
	if !sameButProvenance(fromData, fromDecided) {
		t.Errorf("%s: folded from data %+v, from the decided payload %+v", stored[len(stored)-1].Type, fromData, fromDecided)
	}
	if st := evs[len(evs)-1].Data.(AccountEvent).Change().Status; st != "" && fromData.Status() != st {
		t.Errorf("%s: the change names the status %q, the folded account has %q (Account.Status)", stored[len(stored)-1].Type, st, fromData.Status())
	}
	left, err := AfterOf(evs[len(evs)-1].Data)
	balance, held := left.Balance, left.Held
	if errors.Is(err, ErrNoAfterState) {
		t.Errorf("%s: the sample states no account", stored[len(stored)-1].Type)
	} else if err != nil || balance != fromData.Balance || held != fromData.Held {
		t.Errorf("%s: AfterOf %d/%d (%v), fold %d/%d", stored[len(stored)-1].Type, balance, held, err, fromData.Balance, fromData.Held)
	}
}

// registryStored is a sample stream as a store returns it, each event under
// its own key.
func registryStored(t *testing.T, evs []NewEvent) []StoredEvent {
	t.Helper()
	out := make([]StoredEvent, len(evs))
	for i, ev := range evs {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		m := Metadata{Key: fmt.Sprintf("k%d", i), Command: "c", RequestHash: strings.Repeat("ab", 32), Count: 1, Subject: EventSubject(ev)}
		out[i] = StoredEvent{ID: uuid.New(), Stream: "s", Revision: uint64(i), Type: ev.Type, Data: data, Metadata: m}
	}
	return out
}
