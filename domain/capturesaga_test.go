package domain

import (
	"math"
	"testing"
	"time"
)

// TestCaptureSagaSteps: the guard is a hold of nothing on an open account of
// the capture's currency, refused as the credit would be (closed, another
// currency); the capture takes the guard's refusal only where the held account
// would allow it, its own refusal first; a credit that would leave the int64
// range is refused without a record (the saga stays pending); and the capture
// is read back from its claim.
func TestCaptureSagaSteps(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	open := func(id, cur string, balance int64) *Account {
		a := NewAccount(id)
		a.Opened, a.Currency, a.Balance = true, cur, balance
		return a
	}
	capture := Command{Type: CmdCaptureHold, IdempotencyKey: "k", AccountID: "payer", HoldID: "h", To: "shop", Amount: 30, HasAmount: true, At: at, Metadata: map[string]string{"order": "7"}}

	shop := open("shop", "EUR", 5)
	d := DecideAccount(shop, CaptureGuardCommand(capture, "EUR"))
	if len(d.Events) != 1 || d.Events[0].Type != EvHoldPlaced {
		t.Fatalf("guard: %+v", d)
	}
	if g := d.Events[0].Data.(HoldPlaced); g.HoldID != "capture~k" || g.Amount != 0 || g.HeldAfter != 0 || *g.BalanceAfter != 5 {
		t.Fatalf("guard: %+v", g)
	}
	if d := DecideAccount(open("usd", "USD", 0), CaptureGuardCommand(capture, "EUR")); d.Rejection == nil || d.Rejection.Code != CodeCurrencyMismatch || !d.Rejection.Recorded {
		t.Fatalf("guard on another currency: %+v", d)
	}
	gone := open("gone", "EUR", 0)
	gone.Closed = true
	guardRefusal := DecideAccount(gone, CaptureGuardCommand(capture, "EUR")).Rejection
	if guardRefusal == nil || guardRefusal.Code != CodeAccountClosed || !guardRefusal.Recorded {
		t.Fatalf("guard on a closed account: %+v", guardRefusal)
	}

	payer := open("payer", "EUR", 100)
	payer.Held = 50
	payer.SetHold(&Hold{ID: "h", Amount: 50, Status: HoldStatusActive})
	c := capture
	c.To, c.ToRefusal = "gone", guardRefusal
	if d := DecideAccount(payer, c); d.Rejection == nil || d.Rejection.Message != "capture to gone: account gone is closed" || len(d.Events) != 1 {
		t.Fatalf("capture behind a refused guard: %+v", d)
	}
	c.Amount = 60 // more than the hold: the held account's refusal first
	if d := DecideAccount(payer, c); d.Rejection == nil || d.Rejection.Code != CodeInsufficientFunds {
		t.Fatalf("capture over its hold behind a refused guard: %+v", d)
	}
	c.Amount, c.ToRefusal = 30, MissingAccount("ghost")
	if d := DecideAccount(payer, c); d.Rejection == nil || d.Rejection.Recorded || d.Rejection.Code != CodeAccountNotFound || len(d.Events) != 0 {
		t.Fatalf("capture into no account: %+v", d)
	}

	credit := CaptureSagaCredit(capture, 30, "EUR")
	d = DecideAccount(shop, credit)
	if len(d.Events) != 1 {
		t.Fatalf("credit: %+v", d)
	}
	if e := d.Events[0].Data.(Credited); e.Amount != 30 || e.Reason != ReasonCaptureIn || e.Ref != "h" || e.BalanceAfter != 35 || e.Metadata["order"] != "7" || credit.IdempotencyKey != "k:capture_to" {
		t.Fatalf("credit: %+v under %q", e, credit.IdempotencyKey)
	}
	if d := DecideAccount(open("rich", "EUR", math.MaxInt64-10), credit); d.Rejection == nil || d.Rejection.Recorded || d.Rejection.Code != CodeAmountOverflow {
		t.Fatalf("credit past the int64 range: %+v", d)
	}

	claim := &KeyClaimed{Key: "k", Command: string(CmdCaptureHold), RequestHash: capture.Canonical().Hash, Request: capture.Canonical().JSON}
	back, err := CaptureToCommand("k", claim)
	if err != nil || back.Canonical().Hash != capture.Canonical().Hash {
		t.Fatalf("read back from the claim: %+v %v", back, err)
	}
	conditional := capture // v1.2 §2.3: its expected revision is read back too
	conditional.ExpectedRevision, conditional.HasExpectedRevision = 4, true
	conditional.EffectiveAt = time.Date(2026, 3, 31, 23, 59, 59, 5, time.UTC)
	claim = &KeyClaimed{Key: "k", Command: string(CmdCaptureHold), RequestHash: conditional.Canonical().Hash, Request: conditional.Canonical().JSON}
	if back, err := CaptureToCommand("k", claim); err != nil || back.ExpectedRevision != 4 || !back.HasExpectedRevision || back.Canonical().Hash != conditional.Canonical().Hash ||
		!back.EffectiveAt.Equal(conditional.EffectiveAt.Truncate(time.Microsecond)) { // decided to the microsecond, the request as given
		t.Fatalf("a conditional capture read back from the claim: %+v %v", back, err)
	}
	plain := capture
	plain.To = ""
	claim = &KeyClaimed{Key: "k", Command: string(CmdCaptureHold), RequestHash: plain.Canonical().Hash, Request: plain.Canonical().JSON}
	if _, err := CaptureToCommand("k", claim); err == nil {
		t.Fatal("a capture without `to` read back as a capture saga")
	}
}
