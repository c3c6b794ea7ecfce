package domain

import (
	"testing"
)

// expectRev is cmd with expected_revision rev (v1.2 §2.3).
func expectRev(cmd Command, rev int64) Command {
	cmd.ExpectedRevision, cmd.HasExpectedRevision = rev, true
	return cmd
}

// upTo is cmd with up_to (v1.2 §2.3).
func upTo(cmd Command) Command {
	cmd.UpTo = true
	return cmd
}

func TestExpectedRevision(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 0))     // revision 0
	f.ok(deposit("a", 50)) // 1
	place := hold("a", "h1", 10, t0.Add(1e12))
	release := Command{Type: CmdReleaseHold, AccountID: "a", HoldID: "h1"}
	for _, c := range []struct {
		name string
		cmd  Command
	}{
		{"deposit", deposit("a", 5)}, {"withdraw", withdraw("a", 5)}, {"place_hold", place}, {"release_hold", release},
		{"place_hold again", hold("a", "h2", 10, t0.Add(1e12))}, {"capture_hold", Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h2"}},
	} {
		rev := f.acc.Revision
		// given the account at rev, when the command expects another revision,
		// then it is refused, recorded, and the account moves on by that record
		for _, off := range []int64{-1, +1} {
			wrong := rev + off
			before := f.acc.View()
			d := f.do(expectRev(c.cmd, wrong))
			if d.Rejection == nil || d.Rejection.Code != CodeRevisionMismatch || !d.Rejection.Recorded || len(d.Events) != 1 {
				t.Fatalf("%s expecting %d at %d: %+v", c.name, wrong, rev, d)
			}
			after := f.acc.View()
			if after.Balance != before.Balance || after.Held != before.Held || f.acc.Revision != rev+1 {
				t.Fatalf("%s: a mismatch changed the account: %+v -> %+v", c.name, before, after)
			}
			rev = f.acc.Revision
		}
		// when it expects the revision the account is at, it applies
		f.ok(expectRev(c.cmd, rev))
	}
	f.balances(40, 0) // 50 + 5 - 5 - 10 captured
	// close_account: the revision is checked before emptiness
	f.ok(withdraw("a", 40))
	f.refused(expectRev(Command{Type: CmdCloseAccount, AccountID: "a"}, 0), CodeRevisionMismatch, true)
	f.ok(expectRev(Command{Type: CmdCloseAccount, AccountID: "a"}, f.acc.Revision))
	// a closed account: still the revision first, then the account's own refusal
	f.refused(expectRev(deposit("a", 1), 0), CodeRevisionMismatch, true)
	f.refused(expectRev(deposit("a", 1), f.acc.Revision), CodeAccountClosed, true)
	// an account that does not exist: not recorded, whatever is expected
	g := given(t, "b")
	g.refused(expectRev(deposit("b", 1), 0), CodeAccountNotFound, false)
}

func TestUpToWithdraw(t *testing.T) {
	for _, c := range []struct {
		name                     string
		overdraft, balance, held int64
		asked                    int64
		moved                    int64 // 0: refused insufficient_funds
		balanceAfter             int64
	}{
		{name: "less than available", balance: 100, asked: 30, moved: 30, balanceAfter: 70},
		{name: "exactly available", balance: 100, asked: 100, moved: 100, balanceAfter: 0},
		{name: "more than available", balance: 100, asked: 500, moved: 100, balanceAfter: 0},
		{name: "held funds are not swept", balance: 100, held: 60, asked: 500, moved: 40, balanceAfter: 60},
		{name: "the overdraft is not swept", overdraft: 1000, balance: 100, asked: 500, moved: 100, balanceAfter: 0},
		{name: "nothing available", balance: 0, asked: 1},
		{name: "all held", balance: 50, held: 50, asked: 1},
		{name: "in the overdraft", overdraft: 1000, balance: 0, held: 30, asked: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := given(t, "a")
			f.ok(open("a", c.overdraft))
			if c.balance > 0 {
				f.ok(deposit("a", c.balance))
			}
			if c.held > 0 {
				f.ok(hold("a", "h", c.held, t0.Add(1e12)))
			}
			cmd := upTo(withdraw("a", c.asked))
			cmd.IdempotencyKey = "sweep"
			if c.moved == 0 {
				f.refused(cmd, CodeInsufficientFunds, true)
				if _, ok := f.acc.Keys["sweep"].Moved(); ok {
					t.Fatal("a refused sweep records a moved amount")
				}
				return
			}
			d := f.do(cmd)
			e, ok := d.Events[0].Data.(Debited)
			if !ok || e.Amount != c.moved || e.Requested == nil || *e.Requested != c.asked || e.BalanceAfter != c.balanceAfter {
				t.Fatalf("decided %+v, want %d of %d moved", d.Events, c.moved, c.asked)
			}
			f.balances(c.balanceAfter, c.held)
			if moved, ok := f.acc.Keys["sweep"].Moved(); !ok || moved != c.moved {
				t.Fatalf("record's moved %d %v, want %d", moved, ok, c.moved)
			}
			if f.acc.Keys["sweep"].Amount != c.moved {
				t.Fatalf("a refund of the sweep could take %d, not the %d moved", f.acc.Keys["sweep"].Amount, c.moved)
			}
		})
	}
	// without up_to the record has no moved amount
	f := given(t, "b")
	f.ok(open("b", 0))
	f.ok(deposit("b", 10))
	w := withdraw("b", 4)
	w.IdempotencyKey = "plain"
	f.ok(w)
	if _, ok := f.acc.Keys["plain"].Moved(); ok {
		t.Fatal("a withdrawal without up_to records a moved amount")
	}
}

// accountWith is an opened account holding balance, for a transfer's decision.
func accountWith(t *testing.T, id string, balance int64) *Account {
	f := given(t, id)
	f.ok(open(id, 0))
	if balance > 0 {
		f.ok(deposit(id, balance))
	}
	return f.acc
}

func TestUpToTransferAtomically(t *testing.T) {
	for _, c := range []struct {
		balance, asked, moved int64
	}{{100, 30, 30}, {100, 500, 100}, {0, 5, 0}} {
		s := newTStream(t)
		cmd := upTo(transferCmd("k", "a", "b", c.asked))
		d := DecideTransfer(s.tr, cmd)
		s.must("k", CmdTransfer, d.Events...)
		if !s.tr.Saga.UpTo || s.tr.Saga.Amount != c.asked {
			t.Fatalf("requested saga %+v", s.tr.Saga)
		}
		at, err := DecideTransferAtomically(s.tr, s.tr.Saga, accountWith(t, "a", c.balance), accountWith(t, "b", 0), tAt)
		if err != nil {
			t.Fatal(err)
		}
		s.must(at.MarkerKey, CmdTransfer, at.Marker...)
		if c.moved == 0 {
			if at.Debit.Rejection == nil || at.Debit.Rejection.Code != CodeInsufficientFunds || s.tr.Saga.Stage != SagaRejected {
				t.Fatalf("nothing available: %+v %v", at.Debit, s.tr.Saga.Stage)
			}
			continue
		}
		debit := at.Debit.Events[0].Data.(Debited)
		credit := at.Credit.Events[0].Data.(Credited)
		if debit.Amount != c.moved || credit.Amount != c.moved || at.CreditCmd.Amount != c.moved {
			t.Fatalf("up to %d of %d: debit %d, credit %d", c.asked, c.balance, debit.Amount, credit.Amount)
		}
		// the marker fixes the amount: the transfer, its refunds and its reply are of it
		if s.tr.Saga.Stage != SagaCompleted || s.tr.Amount != c.moved || s.tr.Saga.Amount != c.moved || s.tr.Refundable() != c.moved {
			t.Fatalf("completed transfer %+v saga %+v", s.tr, s.tr.Saga)
		}
	}
}

func TestSagaMovingFixesTheAmount(t *testing.T) {
	s := newTStream(t)
	s.must("k", CmdTransfer, DecideTransfer(s.tr, upTo(transferCmd("k", "a", "b", 100))).Events...)
	sg := s.tr.Saga
	if debit := s.tr.StepCommand(sg, StepDebit, tAt); !debit.UpTo || debit.Amount != 100 {
		t.Fatalf("debit step %+v", debit)
	}
	moved, err := sg.Moving(StepOutcome{Applied: true, Moved: 40})
	if err != nil || moved.Amount != 40 || sg.Amount != 100 {
		t.Fatalf("Moving: %+v %v (saga left at %d)", moved, err, sg.Amount)
	}
	if credit := s.tr.StepCommand(moved, StepCredit, tAt); credit.UpTo || credit.Amount != 40 {
		t.Fatalf("credit step %+v", credit)
	}
	for _, bad := range []int64{0, 101} {
		if _, err := sg.Moving(StepOutcome{Applied: true, Moved: bad}); err == nil {
			t.Fatalf("a debit of up to 100 that moved %d was taken", bad)
		}
	}
	// a refused credit records what to compensate
	mk, err := DecideSagaMarker(s.tr, moved, StepCredit, StepOutcome{Code: CodeAccountClosed, Message: "closed"})
	key, events := mk.Key, mk.Events
	if err != nil {
		t.Fatal(err)
	}
	s.must(key, CmdTransfer, events...)
	if s.tr.Saga.Stage != SagaCompensating || s.tr.Saga.Amount != 40 || s.tr.StepCommand(s.tr.Saga, StepCompensate, tAt).Amount != 40 {
		t.Fatalf("compensating saga %+v", s.tr.Saga)
	}
	// a marker that moved more than was asked does not fold
	s2 := newTStream(t)
	s2.must("k", CmdTransfer, DecideTransfer(s2.tr, upTo(transferCmd("k", "a", "b", 100))).Events...)
	if err := s2.write("k:complete", CmdTransfer, NewEvent{EvTransferCompleted, TransferCompleted{TransferID: "t1", Amount: 101}}); err == nil {
		t.Fatal("a completion of 101 folded on a transfer of up to 100")
	}
	// nor one of another amount than a transfer without up_to asked
	s3 := newTStream(t)
	s3.must("k", CmdTransfer, DecideTransfer(s3.tr, transferCmd("k", "a", "b", 100)).Events...)
	if err := s3.write("k:complete", CmdTransfer, NewEvent{EvTransferCompleted, TransferCompleted{TransferID: "t1", Amount: 40}}); err == nil {
		t.Fatal("a completion of 40 folded on a transfer of 100")
	}
}

func TestDecodeConditions(t *testing.T) {
	for _, c := range []struct {
		typ   CommandType
		body  string
		field string // "" valid
	}{
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":0}`, ""},
		{CmdWithdraw, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":7,"up_to":true}`, ""},
		{CmdWithdraw, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","up_to":false}`, ""},
		{CmdWithdraw, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","up_to":null}`, ""},
		{CmdTransfer, `{"idempotency_key":"k","transfer_id":"t","from":"a","to":"b","amount":5,"currency":"EUR","up_to":true}`, ""},
		{CmdReleaseHold, `{"idempotency_key":"k","account_id":"a","hold_id":"h","expected_revision":3}`, ""},
		{CmdCloseAccount, `{"idempotency_key":"k","account_id":"a","expected_revision":9007199254740991}`, ""},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":-1}`, "expected_revision"},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":1.0}`, "expected_revision"},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":"1"}`, "expected_revision"},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":1e2}`, "expected_revision"},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":9007199254740992}`, "expected_revision"},
		{CmdDeposit, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","up_to":true}`, "up_to"},
		{CmdWithdraw, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","up_to":"true"}`, "up_to"},
		{CmdWithdraw, `{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","up_to":1}`, "up_to"},
		{CmdTransfer, `{"idempotency_key":"k","transfer_id":"t","from":"a","to":"b","amount":5,"currency":"EUR","expected_revision":1}`, "expected_revision"},
		{CmdOpenAccount, `{"idempotency_key":"k","account_id":"a","currency":"EUR","expected_revision":0}`, "expected_revision"},
		{CmdRefund, `{"idempotency_key":"k","original_key":"o","expected_revision":0}`, "expected_revision"},
		{CmdPostTransaction, `{"idempotency_key":"k","transaction_id":"x","postings":[{"from":"a","to":"b","amount":1,"currency":"EUR"}],"up_to":true}`, "up_to"},
	} {
		cmd, ierr := DecodeCommand(c.typ, []byte(c.body))
		switch {
		case c.field == "" && ierr != nil:
			t.Errorf("%s: refused: %v", c.body, ierr)
		case c.field != "" && (ierr == nil || ierr.Field != c.field):
			t.Errorf("%s: %+v, want invalid naming %s", c.body, ierr, c.field)
		case c.field == "":
			general, gerr := decodeGeneral(c.typ, commandFields[c.typ], []byte(c.body))
			if gerr != nil || general.Canonical().Hash != cmd.Canonical().Hash {
				t.Errorf("%s: the fast and the general decoder differ", c.body)
			}
		}
	}
	// both fields are part of the request: a resend with another value is a conflict naming it
	a, _ := DecodeCommand(CmdWithdraw, []byte(`{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":1}`))
	b, _ := DecodeCommand(CmdWithdraw, []byte(`{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":2,"up_to":true}`))
	if got := DiffFields(a.Request(), b.Request()); len(got) != 2 || got[0] != "expected_revision" || got[1] != "up_to" {
		t.Fatalf("differing fields %v", got)
	}
	// up_to false is the default: the same request as none
	c, _ := DecodeCommand(CmdWithdraw, []byte(`{"idempotency_key":"k","account_id":"a","amount":5,"currency":"EUR","expected_revision":1,"up_to":false}`))
	if c.Canonical().Hash != a.Canonical().Hash {
		t.Fatal("up_to false hashes apart from no up_to")
	}
}
