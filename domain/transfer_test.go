package domain

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

var tAt = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// tstream folds events into a transfer as the store would hand them back.
type tstream struct {
	t   *testing.T
	tr  *Transfer
	rev uint64
}

func newTStream(t *testing.T) *tstream { return &tstream{t: t, tr: NewTransfer("t1")} }

// write folds the events one command key wrote.
func (s *tstream) write(key string, cmd CommandType, events ...NewEvent) error {
	s.t.Helper()
	for i, ev := range events {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			s.t.Fatal(err)
		}
		m := Metadata{Key: key, Command: string(cmd), RequestHash: "h-" + key, Index: i, Count: len(events), At: tAt}
		if i == 0 {
			m.Request = []byte(`{"type":"` + string(cmd) + `"}`)
		}
		stored := StoredEvent{ID: EventID(key, "transfer-t1", i), Stream: "transfer-t1", Revision: s.rev, Type: ev.Type, Data: data, Metadata: m, Position: "1/1"}
		if err := EvolveTransfer(s.tr, stored); err != nil {
			return err
		}
		s.rev++
	}
	return nil
}

func (s *tstream) must(key string, cmd CommandType, events ...NewEvent) {
	s.t.Helper()
	if err := s.write(key, cmd, events...); err != nil {
		s.t.Fatal(err)
	}
}

func transferCmd(key, from, to string, amount int64) Command {
	return Command{Type: CmdTransfer, IdempotencyKey: key, TransferID: "t1", From: from, To: to, Amount: amount, HasAmount: true, Currency: "EUR", At: tAt}
}

func refundCmd(key, orig string, amount int64) Command {
	c := Command{Type: CmdRefund, IdempotencyKey: key, OriginalKey: orig, At: tAt}
	if amount > 0 {
		c.Amount, c.HasAmount = amount, true
	}
	return c
}

// completed returns a stream whose transfer K of 100 EUR alice->bob completed.
func completed(t *testing.T) *tstream {
	s := newTStream(t)
	d := DecideTransfer(s.tr, transferCmd("K", "alice", "bob", 100))
	s.must("K", CmdTransfer, d.Events...)
	mk, err := DecideSagaMarker(s.tr, s.tr.Saga, StepCredit, StepOutcome{Applied: true})
	key, evs := mk.Key, mk.Events
	if err != nil || key != "K:complete" {
		t.Fatalf("complete marker: %q %v", key, err)
	}
	s.must(key, CmdTransfer, evs...)
	return s
}

func TestDecideTransfer(t *testing.T) {
	s := newTStream(t)
	d := DecideTransfer(s.tr, transferCmd("K", "alice", "bob", 100))
	if !d.Applied() || len(d.Events) != 1 || d.Events[0].Type != EvTransferRequested {
		t.Fatalf("new transfer: %+v", d)
	}
	s.must("K", CmdTransfer, d.Events...)
	if !s.tr.Requested || s.tr.Key() != "K" || s.tr.Saga.Stage != SagaPending || s.tr.Saga.Out != "alice" || s.tr.Saga.In != "bob" {
		t.Fatalf("after request: %+v %+v", s.tr, s.tr.Saga)
	}
	if got := s.tr.Pending(); len(got) != 1 || got[0] != "K" {
		t.Fatalf("pending %v", got)
	}
	// The id is taken, whatever the key: not recorded.
	d = DecideTransfer(s.tr, transferCmd("K2", "alice", "bob", 100))
	if d.Rejection == nil || d.Rejection.Code != CodeTransferExists || d.Rejection.Recorded || len(d.Events) != 0 {
		t.Fatalf("used id: %+v", d)
	}
}

func TestDecideTransferSameAccount(t *testing.T) {
	s := newTStream(t)
	d := DecideTransfer(s.tr, transferCmd("K", "alice", "alice", 100))
	if d.Rejection == nil || d.Rejection.Code != CodeSameAccount || !d.Rejection.Recorded || len(d.Events) != 2 {
		t.Fatalf("same account: %+v", d)
	}
	s.must("K", CmdTransfer, d.Events...)
	sg := s.tr.Saga
	if sg.Stage != SagaRejected || sg.Code != CodeSameAccount || !sg.Outright || len(sg.Events) != 2 || len(s.tr.Pending()) != 0 {
		t.Fatalf("after: %+v", sg)
	}
}

func TestDecideSagaMarker(t *testing.T) {
	refused := StepOutcome{Code: CodeAccountClosed, Message: "closed"}
	applied := StepOutcome{Applied: true}
	cases := []struct {
		name    string
		stage   SagaStage
		refund  bool
		step    string
		o       StepOutcome
		key     string // "" with wantTyp "": no marker
		typ     string
		wantErr bool
	}{
		{"debit applied goes on", SagaPending, false, StepDebit, applied, "", "", false},
		{"debit refused rejects", SagaPending, false, StepDebit, refused, "K:reject", EvTransferRejected, false},
		{"credit applied completes", SagaPending, false, StepCredit, applied, "K:complete", EvTransferCompleted, false},
		{"credit refused is recorded first", SagaPending, false, StepCredit, refused, "K:refuse", EvTransferCreditRefused, false},
		{"compensated fails", SagaCompensating, false, StepCompensate, applied, "K:fail", EvTransferFailed, false},
		{"refused compensation writes nothing", SagaCompensating, false, StepCompensate, refused, "", "", true},
		{"no credit while compensating", SagaCompensating, false, StepCredit, applied, "", "", true},
		{"no compensation while pending", SagaPending, false, StepCompensate, applied, "", "", true},
		{"nothing after a decision", SagaCompleted, false, StepCredit, applied, "", "", true},
		{"refund debit refused", SagaPending, true, StepDebit, refused, "K:reject", EvRefundRejected, false},
		{"refund credit applied", SagaPending, true, StepCredit, applied, "K:complete", EvRefundCompleted, false},
		{"refund credit refused", SagaPending, true, StepCredit, refused, "K:refuse", EvRefundCreditRefused, false},
		{"refund compensated", SagaCompensating, true, StepCompensate, applied, "K:fail", EvRefundFailed, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTransfer("t1")
			sg := &Saga{Key: "K", Stage: c.stage, Refund: c.refund, Amount: 5, Code: CodeAccountClosed, Message: "closed"}
			mk, err := DecideSagaMarker(tr, sg, c.step, c.o)
			key, evs := mk.Key, mk.Events
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if key != c.key || (c.typ == "" && len(evs) != 0) || (c.typ != "" && (len(evs) != 1 || evs[0].Type != c.typ)) {
				t.Fatalf("got %q %+v, want %q %s", key, evs, c.key, c.typ)
			}
		})
	}
}

func TestTransferFailsOnlyAfterTheRefusalIsRecorded(t *testing.T) {
	s := newTStream(t)
	s.must("K", CmdTransfer, DecideTransfer(s.tr, transferCmd("K", "alice", "bob", 100)).Events...)
	// A failure straight from pending would skip the recorded refusal: refused.
	if err := s.write("K:fail", CmdTransfer, NewEvent{EvTransferFailed, TransferFailed{TransferID: "t1", Code: CodeAccountClosed}}); err == nil {
		t.Fatal("TransferFailed accepted without TransferCreditRefused")
	}
	mk, _ := DecideSagaMarker(s.tr, s.tr.Saga, StepCredit, StepOutcome{Code: CodeAccountClosed, Message: "bob is closed"})
	key, evs := mk.Key, mk.Events
	s.must(key, CmdTransfer, evs...)
	if s.tr.Saga.Stage != SagaCompensating || s.tr.Saga.Code != CodeAccountClosed {
		t.Fatalf("after refusal: %+v", s.tr.Saga)
	}
	if err := s.write("K:complete", CmdTransfer, NewEvent{EvTransferCompleted, TransferCompleted{TransferID: "t1"}}); err == nil {
		t.Fatal("completed after the credit was refused")
	}
	mk, _ = DecideSagaMarker(s.tr, s.tr.Saga, StepCompensate, StepOutcome{Applied: true})
	key, evs = mk.Key, mk.Events
	if evs[0].Data.(TransferFailed).Code != CodeAccountClosed {
		t.Fatalf("failure does not report the refusal: %+v", evs[0].Data)
	}
	s.must(key, CmdTransfer, evs...)
	if s.tr.Saga.Stage != SagaFailed || s.tr.Saga.Stage.Status() != "failed" || len(s.tr.Pending()) != 0 {
		t.Fatalf("after compensation: %+v", s.tr.Saga)
	}
}

func TestStepCommand(t *testing.T) {
	s := completed(t)
	sg := s.tr.Saga
	for _, c := range []struct {
		step, account, reason string
		typ                   CommandType
	}{
		{StepDebit, "alice", ReasonTransferOut, CmdTransferDebit},
		{StepCredit, "bob", ReasonTransferIn, CmdTransferCredit},
		{StepCompensate, "alice", ReasonTransferCompensate, CmdTransferCompensate},
	} {
		cmd := s.tr.StepCommand(sg, c.step, tAt)
		if cmd.Type != c.typ || cmd.AccountID != c.account || cmd.Reason != c.reason || cmd.IdempotencyKey != "K:"+c.step ||
			cmd.Ref != "t1" || cmd.Origin != "K" || cmd.Amount != 100 || cmd.Currency != "EUR" {
			t.Fatalf("%s: %+v", c.step, cmd)
		}
	}
	d := DecideTransferRefund(s.tr, refundCmd("R", "K", 30))
	s.must("R", CmdRefund, d.Events...)
	rf := s.tr.Refunds["R"]
	for _, c := range []struct{ step, account, reason string }{
		{StepDebit, "bob", ReasonRefundOut}, {StepCredit, "alice", ReasonRefundIn}, {StepCompensate, "bob", ReasonRefundCompensate},
	} {
		cmd := s.tr.StepCommand(rf, c.step, tAt)
		if cmd.AccountID != c.account || cmd.Reason != c.reason || cmd.IdempotencyKey != "R:"+c.step || cmd.Amount != 30 {
			t.Fatalf("refund %s: %+v", c.step, cmd)
		}
	}
	// A step's request is deterministic: the same intent on every instance.
	if a, b := s.tr.StepCommand(sg, StepDebit, tAt).Request().Hash(), s.tr.StepCommand(sg, StepDebit, tAt.Add(time.Hour)).Request().Hash(); a != b {
		t.Fatal("step request depends on the time")
	}
}

func TestDecideTransferRefund(t *testing.T) {
	s := completed(t)
	if got := s.tr.Refundable(); got != 100 {
		t.Fatalf("refundable %d", got)
	}
	// Partial refund reserves its amount while in flight.
	d := DecideTransferRefund(s.tr, refundCmd("R1", "K", 60))
	if !d.Applied() || d.Events[0].Type != EvTransferRefundRequested {
		t.Fatalf("refund: %+v", d)
	}
	s.must("R1", CmdRefund, d.Events...)
	if s.tr.Refundable() != 40 || s.tr.Refunds["R1"].Stage != SagaPending || s.tr.Refunds["R1"].Out != "bob" {
		t.Fatalf("after R1: %d %+v", s.tr.Refundable(), s.tr.Refunds["R1"])
	}
	// Over what is left, in flight included: recorded.
	d = DecideTransferRefund(s.tr, refundCmd("R2", "K", 41))
	if d.Rejection == nil || d.Rejection.Code != CodeRefundExceedsOriginal || !d.Rejection.Recorded || d.Events[0].Type != EvRefundRejected {
		t.Fatalf("overrun: %+v", d)
	}
	s.must("R2", CmdRefund, d.Events...)
	if r := s.tr.Refunds["R2"]; r.Stage != SagaRejected || !r.Outright || r.Code != CodeRefundExceedsOriginal || s.tr.Refundable() != 40 {
		t.Fatalf("after overrun: %+v %d", r, s.tr.Refundable())
	}
	// R1's debit is refused: its reservation is released.
	mk, _ := DecideSagaMarker(s.tr, s.tr.Refunds["R1"], StepDebit, StepOutcome{Code: CodeInsufficientFunds, Message: "no"})
	key, evs := mk.Key, mk.Events
	s.must(key, CmdRefund, evs...)
	if s.tr.Refundable() != 100 || s.tr.Refunds["R1"].Stage != SagaRejected {
		t.Fatalf("after R1 rejected: %d", s.tr.Refundable())
	}
	// The default amount is all that is left.
	d = DecideTransferRefund(s.tr, refundCmd("R3", "K", 0))
	if !d.Applied() || d.Events[0].Data.(TransferRefundRequested).Amount != 100 {
		t.Fatalf("default amount: %+v", d)
	}
	s.must("R3", CmdRefund, d.Events...)
	mk, _ = DecideSagaMarker(s.tr, s.tr.Refunds["R3"], StepCredit, StepOutcome{Applied: true})
	key, evs = mk.Key, mk.Events
	s.must(key, CmdRefund, evs...)
	d = DecideTransferRefund(s.tr, refundCmd("R4", "K", 0))
	if d.Rejection == nil || d.Rejection.Code != CodeRefundExceedsOriginal {
		t.Fatalf("nothing left: %+v", d)
	}
	// A refund is not refundable; an unknown original is not recorded.
	d = DecideTransferRefund(s.tr, refundCmd("R5", "R3", 0))
	if d.Rejection == nil || d.Rejection.Code != CodeNotRefundable || !d.Rejection.Recorded {
		t.Fatalf("refund of a refund: %+v", d)
	}
	d = DecideTransferRefund(s.tr, refundCmd("R6", "nope", 0))
	if d.Rejection == nil || d.Rejection.Code != CodeOriginalNotFound || d.Rejection.Recorded {
		t.Fatalf("unknown original: %+v", d)
	}
	if got := s.tr.Pending(); len(got) != 0 {
		t.Fatalf("pending %v", got)
	}
}

func TestRefundOfUndecidedOrRefusedTransfer(t *testing.T) {
	s := newTStream(t)
	s.must("K", CmdTransfer, DecideTransfer(s.tr, transferCmd("K", "alice", "bob", 100)).Events...)
	d := DecideTransferRefund(s.tr, refundCmd("R", "K", 0))
	if d.Rejection == nil || d.Rejection.Code != CodeNotRefundable || d.Rejection.Recorded {
		t.Fatalf("pending original: %+v", d)
	}
	mk, _ := DecideSagaMarker(s.tr, s.tr.Saga, StepDebit, StepOutcome{Code: CodeInsufficientFunds, Message: "no"})
	key, evs := mk.Key, mk.Events
	s.must(key, CmdTransfer, evs...)
	d = DecideTransferRefund(s.tr, refundCmd("R", "K", 0))
	if d.Rejection == nil || d.Rejection.Code != CodeNotRefundable || !d.Rejection.Recorded {
		t.Fatalf("rejected original: %+v", d)
	}
	// The store refuses what the decision refuses.
	if err := s.write("R", CmdRefund, NewEvent{EvTransferRefundRequested, TransferRefundRequested{RefundKey: "R", Amount: 1}}); err == nil {
		t.Fatal("refund of a rejected transfer folded")
	}
}

func TestEvolveTransferRejectsGapsAndForeignEvents(t *testing.T) {
	tr := NewTransfer("t1")
	data, _ := json.Marshal(TransferRequested{TransferID: "t1", From: "a", To: "b", Amount: 1, Currency: "EUR"})
	if err := EvolveTransfer(tr, StoredEvent{Stream: "transfer-t1", Revision: 1, Type: EvTransferRequested, Data: data}); err == nil || !strings.Contains(err.Error(), "revision") {
		t.Fatalf("gap: %v", err)
	}
	if err := EvolveTransfer(tr, StoredEvent{Stream: "transfer-t1", Revision: 0, Type: EvCredited, Data: []byte(`{}`)}); err == nil {
		t.Fatal("account event folded into a transfer")
	}
	if err := EvolveTransfer(tr, StoredEvent{Stream: "transfer-t1", Revision: 0, Type: EvRefundCompleted, Data: []byte(`{"refund_key":"R"}`)}); err == nil {
		t.Fatal("marker of an unknown refund folded")
	}
}

// A refund decided at once: its debit on the transfer's destination, its
// credit on the transfer's source; a source that refuses the credit refuses the
// debit, recorded on the destination with the source's code, and the marker
// rejects the refund (its reservation released). Decided on a clone, the
// transfer itself is untouched.
func TestDecideRefundAtomically(t *testing.T) {
	s := completed(t)
	bob := given(t, "bob")
	bob.ok(open("bob", 0))
	bob.ok(deposit("bob", 100))
	alice := given(t, "alice")
	alice.ok(open("alice", 0))

	for _, c := range []struct {
		name       string
		closed     bool
		marker     string
		debit      string
		code       Code
		refundable int64
	}{
		{"completed", false, EvRefundCompleted, EvDebited, CodeOK, 40},
		{"source closed", true, EvRefundRejected, EvCommandRejected, CodeAccountClosed, 100},
	} {
		if c.closed {
			alice.ok(Command{Type: CmdCloseAccount, AccountID: "alice"})
		}
		scratch := s.tr.Clone()
		req := DecideTransferRefund(scratch, refundCmd("R", "K", 60))
		w := &tstream{t: t, tr: scratch, rev: s.rev}
		w.must("R", CmdRefund, req.Events...)
		sg := scratch.Refunds["R"]
		if _, ok := s.tr.Refunds["R"]; ok || s.tr.Revision != int64(s.rev)-1 || s.tr.Reserved != 0 {
			t.Fatalf("%s: the clone's request reached the transfer: %+v", c.name, s.tr)
		}
		d, err := DecideTransferAtomically(scratch, sg, bob.acc, alice.acc, tAt)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d.DebitCmd.AccountID != "bob" || d.CreditCmd.AccountID != "alice" || d.DebitCmd.Reason != ReasonRefundOut || d.CreditCmd.Reason != ReasonRefundIn {
			t.Fatalf("%s: steps %+v %+v", c.name, d.DebitCmd, d.CreditCmd)
		}
		if d.Debit.Events[0].Type != c.debit || (len(d.Credit.Events) > 0) == c.closed || d.MarkerKey != StepKey("R", map[bool]string{false: StepComplete, true: StepReject}[c.closed]) {
			t.Fatalf("%s: debit %+v credit %+v marker %q", c.name, d.Debit, d.Credit, d.MarkerKey)
		}
		w.must(d.MarkerKey, CmdRefund, d.Marker...)
		if d.Marker[0].Type != c.marker || sg.Code != c.code || scratch.Refundable() != c.refundable {
			t.Fatalf("%s: marker %s, saga %+v, refundable %d", c.name, d.Marker[0].Type, sg, scratch.Refundable())
		}
	}
}
