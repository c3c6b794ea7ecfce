package domain

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// given folds the events that a list of commands produce, failing on any refusal.
type fixture struct {
	t   *testing.T
	acc *Account
	n   int
}

func given(t *testing.T, id string) *fixture { return &fixture{t: t, acc: NewAccount(id)} }

// do decides cmd and applies what it decided, as the command handler would.
func (f *fixture) do(cmd Command) Decision {
	f.t.Helper()
	if cmd.At.IsZero() {
		cmd.At = t0
	}
	if cmd.IdempotencyKey == "" {
		f.n++
		cmd.IdempotencyKey = "k" + string(rune('a'+f.n))
	}
	d := DecideAccount(f.acc, cmd)
	req := cmd.Request()
	for i, ev := range d.Events {
		data, err := json.Marshal(ev.Data)
		if err != nil {
			f.t.Fatal(err)
		}
		m := Metadata{Key: cmd.IdempotencyKey, Command: string(cmd.Type), RequestHash: req.Hash(), Index: i, Count: len(d.Events)}
		if i == 0 {
			m.Request = req.CanonicalJSON()
		}
		stored := StoredEvent{ID: EventID(cmd.IdempotencyKey, AccountStream(f.acc.ID), i), Stream: AccountStream(f.acc.ID), Revision: uint64(f.acc.Revision + 1), Type: ev.Type, Data: data, Metadata: m}
		if err := EvolveAccount(f.acc, stored); err != nil {
			f.t.Fatal(err)
		}
	}
	return d
}

func (f *fixture) ok(cmd Command) {
	f.t.Helper()
	if d := f.do(cmd); !d.Applied() {
		f.t.Fatalf("%s refused: %+v %+v", cmd.Type, d.Rejection, d.Invalid)
	}
}

func (f *fixture) refused(cmd Command, code Code, recorded bool) {
	f.t.Helper()
	rev := f.acc.Revision
	d := f.do(cmd)
	if d.Rejection == nil || d.Rejection.Code != code || d.Rejection.Recorded != recorded {
		f.t.Fatalf("%s: got %+v (invalid %v), want %s recorded=%v", cmd.Type, d.Rejection, d.Invalid, code, recorded)
	}
	if wantRev := rev + map[bool]int64{true: 1, false: 0}[recorded]; f.acc.Revision != wantRev {
		f.t.Fatalf("revision %d after refusal, want %d", f.acc.Revision, wantRev)
	}
}

func (f *fixture) balances(balance, held int64) {
	f.t.Helper()
	if f.acc.Balance != balance || f.acc.Held != held || f.acc.Available() != balance-held {
		f.t.Fatalf("balance %d held %d available %d, want %d %d %d", f.acc.Balance, f.acc.Held, f.acc.Available(), balance, held, balance-held)
	}
}

func open(id string, overdraft int64) Command {
	return Command{Type: CmdOpenAccount, AccountID: id, Currency: "EUR", OverdraftLimit: overdraft}
}
func deposit(id string, amt int64) Command {
	return Command{Type: CmdDeposit, AccountID: id, Amount: amt, HasAmount: true, Currency: "EUR"}
}
func withdraw(id string, amt int64) Command {
	return Command{Type: CmdWithdraw, AccountID: id, Amount: amt, HasAmount: true, Currency: "EUR"}
}
func hold(id, h string, amt int64, exp time.Time) Command {
	return Command{Type: CmdPlaceHold, AccountID: id, HoldID: h, Amount: amt, HasAmount: true, Currency: "EUR", ExpiresAt: exp}
}

func TestAccountLifecycle(t *testing.T) {
	f := given(t, "a")
	f.refused(deposit("a", 5), CodeAccountNotFound, false)
	f.ok(open("a", 0))
	f.refused(open("a", 0), CodeAccountExists, true)
	f.ok(deposit("a", 100))
	f.refused(Command{Type: CmdDeposit, AccountID: "a", Amount: 1, HasAmount: true, Currency: "USD"}, CodeCurrencyMismatch, true)
	f.refused(withdraw("a", 101), CodeInsufficientFunds, true)
	f.ok(withdraw("a", 100))
	f.balances(0, 0)
	f.ok(Command{Type: CmdCloseAccount, AccountID: "a"})
	f.refused(deposit("a", 1), CodeAccountClosed, true)
	f.refused(Command{Type: CmdCloseAccount, AccountID: "a"}, CodeAccountClosed, true)
}

func TestOverdraftAndOverflow(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 50))
	f.ok(withdraw("a", 50))
	f.balances(-50, 0)
	f.refused(withdraw("a", 1), CodeInsufficientFunds, true)
	f.refused(Command{Type: CmdCloseAccount, AccountID: "a"}, CodeAccountNotEmpty, true)
	g := given(t, "b")
	g.ok(open("b", 0))
	for i := 0; i < 1024; i++ {
		g.ok(deposit("b", MaxAmount))
	}
	// 1024 * (2^53-1) is just below 2^63; a few more must overflow, not wrap.
	for g.acc.Balance <= math.MaxInt64-MaxAmount {
		g.ok(deposit("b", MaxAmount))
	}
	g.refused(deposit("b", MaxAmount), CodeAmountOverflow, true)
}

func TestHolds(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 0))
	f.ok(deposit("a", 100))
	f.ok(hold("a", "h1", 70, time.Time{}))
	f.balances(100, 70)
	f.refused(withdraw("a", 31), CodeInsufficientFunds, true) // held money is not available
	f.refused(hold("a", "h1", 1, time.Time{}), CodeHoldExists, true)
	// partial capture debits 50 and releases the other 20
	f.ok(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h1", Amount: 50, HasAmount: true})
	f.balances(50, 0)
	f.refused(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h1"}, CodeHoldNotActive, true)
	f.refused(Command{Type: CmdReleaseHold, AccountID: "a", HoldID: "nope"}, CodeHoldNotFound, true)
	// capture after release
	f.ok(hold("a", "h2", 10, time.Time{}))
	f.ok(Command{Type: CmdReleaseHold, AccountID: "a", HoldID: "h2"})
	f.balances(50, 0)
	f.refused(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h2"}, CodeHoldNotActive, true)
	// capture more than held
	f.ok(hold("a", "h3", 10, time.Time{}))
	f.refused(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h3", Amount: 11, HasAmount: true}, CodeInsufficientFunds, true)
	f.ok(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h3"})
	f.balances(40, 0)
}

func TestHoldExpiryUsesCommandTime(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 0))
	f.ok(deposit("a", 100))
	exp := t0.Add(time.Hour)
	f.ok(hold("a", "h", 60, exp))
	// the expiry scheduler before the deadline: refused, not recorded
	f.refused(Command{Type: CmdExpireHold, AccountID: "a", HoldID: "h", At: exp.Add(-time.Second), IdempotencyKey: "x:expire"}, CodeHoldNotActive, false)
	// a capture at the deadline is too late
	f.refused(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h", At: exp}, CodeHoldExpired, true)
	f.ok(Command{Type: CmdExpireHold, AccountID: "a", HoldID: "h", At: exp, IdempotencyKey: "x:expire"})
	f.balances(100, 0)
	if f.acc.Holds["h"].Status != HoldStatusExpired {
		t.Fatalf("hold status %s", f.acc.Holds["h"].Status)
	}
	f.refused(Command{Type: CmdCaptureHold, AccountID: "a", HoldID: "h", At: exp}, CodeHoldExpired, true)
	if d := f.do(hold("a", "h9", 1, t0.Add(-time.Second))); d.Invalid == nil || d.Invalid.Field != "expires_at" {
		t.Fatalf("a hold expiring in the past: %+v", d)
	}
}

func TestRefundsOfDepositsAndWithdrawals(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 0))
	dep := deposit("a", 100)
	dep.IdempotencyKey = "dep"
	f.ok(dep)
	refund := func(key string, amt int64) Command {
		c := Command{Type: CmdRefund, OriginalKey: key, IdempotencyKey: "r-" + key + "-" + string(rune('a'+f.acc.Revision))}
		if amt > 0 {
			c.Amount, c.HasAmount = amt, true
		}
		return c
	}
	f.ok(refund("dep", 30))
	f.balances(70, 0)
	f.refused(refund("dep", 71), CodeRefundExceedsOriginal, true)
	f.ok(refund("dep", 0)) // the rest: 70
	f.balances(0, 0)
	f.refused(refund("dep", 0), CodeRefundExceedsOriginal, true)
	f.refused(refund("nope", 0), CodeOriginalNotFound, false)

	w := given(t, "b")
	w.ok(open("b", 0))
	w.ok(deposit("b", 10))
	wd := withdraw("b", 10)
	wd.IdempotencyKey = "wd"
	w.ok(wd)
	w.ok(Command{Type: CmdRefund, OriginalKey: "wd", IdempotencyKey: "r1"})
	w.balances(10, 0)
	rejected := withdraw("b", 1000)
	rejected.IdempotencyKey = "big"
	w.refused(rejected, CodeInsufficientFunds, true)
	w.refused(Command{Type: CmdRefund, OriginalKey: "big", IdempotencyKey: "r2"}, CodeNotRefundable, true)
}

func TestKeyRecordsRememberOutcomes(t *testing.T) {
	f := given(t, "a")
	f.ok(open("a", 0))
	w := withdraw("a", 5)
	w.IdempotencyKey = "w"
	f.refused(w, CodeInsufficientFunds, true)
	rec := f.acc.Keys["w"]
	if rec == nil || rec.Status != StatusRejected || rec.Code != CodeInsufficientFunds || len(rec.Events) != 1 || rec.After().Revision != 1 {
		t.Fatalf("record %+v", rec)
	}
	read := func() ([]byte, error) { return w.Canonical().JSON, nil }
	if j, err := Judge(rec.DecidedFor(read), w.Canonical()); err != nil || j.Verdict != KeyDuplicate {
		t.Fatalf("the same request: %+v %v, want a duplicate", j, err)
	}
	other := withdraw("a", 6)
	if j, err := Judge(rec.DecidedFor(read), other.Canonical()); err != nil || j.Verdict != KeyConflict || len(j.Fields) != 1 || j.Fields[0] != "amount" {
		t.Fatalf("another amount: %+v %v, want a conflict in amount", j, err)
	}
}

func TestEvolveRefusesGapsAndLies(t *testing.T) {
	a := NewAccount("a")
	opened, _ := json.Marshal(AccountOpened{AccountID: "a", Currency: "EUR"})
	if err := EvolveAccount(a, StoredEvent{Revision: 1, Type: EvAccountOpened, Data: opened}); err == nil {
		t.Fatal("accepted an event after a gap")
	}
	if err := EvolveAccount(a, StoredEvent{Revision: 0, Type: EvAccountOpened, Data: opened}); err != nil {
		t.Fatal(err)
	}
	lie, _ := json.Marshal(Credited{Amount: 5, Currency: "EUR", BalanceAfter: 6})
	if err := EvolveAccount(a, StoredEvent{Revision: 1, Type: EvCredited, Data: lie}); err == nil {
		t.Fatal("accepted a credit whose balance_after does not follow")
	}
}
