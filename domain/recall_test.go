package domain

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleStream decides sampleAccountCommands on account "a" and returns the
// events as stored, and the events of each key.
func sampleStream(t *testing.T) ([]StoredEvent, map[string][]StoredEvent) {
	t.Helper()
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAccount("a")
	var all []StoredEvent
	byKey := map[string][]StoredEvent{}
	for i, cmd := range sampleAccountCommands(at) {
		cmd.IdempotencyKey, cmd.At = fmt.Sprintf("k%d", i), at
		d := DecideAccount(a, cmd)
		for j := range d.Events {
			ev := storedOf(t, cmd, d.Events, j, uint64(a.Revision+1), fmt.Sprintf("p%d", len(all)))
			if err := EvolveAccount(a, ev); err != nil {
				t.Fatal(err)
			}
			all = append(all, ev)
			byKey[cmd.IdempotencyKey] = append(byKey[cmd.IdempotencyKey], ev)
		}
	}
	return all, byKey
}

// viaSnapshot is a's snapshot, decoded.
func viaSnapshot(t *testing.T, a *Account) *Account {
	t.Helper()
	b, err := EncodeSnapshot("account-"+a.ID, a)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := DecodeSnapshot("account-"+a.ID, b)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func fold(t *testing.T, a *Account, evs []StoredEvent) *Account {
	t.Helper()
	for _, ev := range evs {
		if err := EvolveAccount(a, ev); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// sameRecord compares what a reply reads of two records.
func sameRecord(t *testing.T, key string, got, want *KeyRecord) {
	t.Helper()
	if got.Key != want.Key || got.Command != want.Command || got.RequestHash != want.RequestHash || got.Status != want.Status ||
		got.Code != want.Code || got.Message != want.Message || got.Position != want.Position || got.Amount != want.Amount ||
		!reflect.DeepEqual(got.Events, want.Events) || got.After() != want.After() {
		t.Fatalf("%s: recalled record %+v (after %+v)\nfolded record %+v (after %+v)", key, got, got.After(), want, want.After())
	}
}

// TestBoundedKeysRecallFromEvents: an aggregate bounded to 3 keys holds the same
// state as an unbounded one and only its 3 latest keys; every forgotten key's
// record, rebuilt from its own events alone, is the record the unbounded fold
// made (the reply of a duplicate of any age is the original one).
func TestBoundedKeysRecallFromEvents(t *testing.T) {
	all, byKey := sampleStream(t)
	full := fold(t, NewAccount("a"), all)
	bounded := NewAccount("a")
	bounded.KeyLimit = 3
	fold(t, bounded, all)
	if len(bounded.Keys) != 3 || bounded.Keys["k13"] == nil || bounded.Keys["k11"] == nil || bounded.Keys["k10"] != nil {
		t.Fatalf("bounded keys: %v", keysOf(bounded))
	}
	if ok, diff := SameState(bounded, full); !ok || bounded.Refunded.Of("k1").Amount != 40 || bounded.Refunded.Of("k2").Amount != 30 {
		t.Fatalf("bounded state differs: %s (refunded %v)", diff, bounded.Refunded)
	}
	for key, evs := range byKey {
		rec, err := bounded.RecallKey(evs)
		if err != nil {
			t.Fatal(err)
		}
		sameRecord(t, key, rec, full.Keys[key])
		if len(bounded.Keys) > 3 || bounded.Keys[key] != rec {
			t.Fatalf("%s: recalled but not remembered, or the bound broke: %v", key, keysOf(bounded))
		}
	}
	// A refund decided on the bounded aggregate of an original it recalled
	// sees what was refunded of it already.
	if _, err := bounded.RecallKey(byKey["k1"]); err != nil {
		t.Fatal(err)
	}
	d := DecideAccount(bounded, Command{Type: CmdRefund, IdempotencyKey: "r", OriginalKey: "k1", Amount: 61, HasAmount: true})
	if d.Rejection == nil || d.Rejection.Code != CodeRefundExceedsOriginal {
		t.Fatalf("refund beyond the original's rest: %+v", d)
	}
}

func keysOf(a *Account) []string {
	var ks []string
	for k := range a.Keys {
		ks = append(ks, k)
	}
	return ks
}

// TestRecallRefusesWhatItCannotRebuild: an event without its after-state (as
// written before events stated it), a partial write, or events of two keys.
func TestRecallRefusesWhatItCannotRebuild(t *testing.T) {
	_, byKey := sampleStream(t)
	legacy := append([]StoredEvent(nil), byKey["k1"]...)
	var c Credited
	if err := json.Unmarshal(legacy[0].Data, &c); err != nil {
		t.Fatal(err)
	}
	c.HeldAfter = nil
	legacy[0].Data, _ = json.Marshal(c)
	a := NewAccount("a")
	if _, err := a.RecallKey(legacy); !errors.Is(err, ErrNoAfterState) {
		t.Fatalf("legacy event: %v", err)
	}
	if _, err := a.RecallKey(nil); err == nil {
		t.Fatal("no events: recalled")
	}
	if _, err := a.RecallKey([]StoredEvent{byKey["k1"][0], byKey["k2"][0]}); err == nil {
		t.Fatal("two keys: recalled")
	}
	if len(a.Keys) != 0 {
		t.Fatalf("a refused recall remembered: %v", keysOf(a))
	}
}

// TestSnapshotRoundTrip: a snapshot taken at any revision, with the events after
// it folded on top, is the state of the whole fold, also of an aggregate that
// keeps one closed hold and one refunded original (it forgot the others); a
// snapshot that was tampered with, of another version or of another stream is
// refused; SameState sees a changed state.
func TestSnapshotRoundTrip(t *testing.T) {
	all, _ := sampleStream(t)
	full := fold(t, NewAccount("a"), all)
	for _, limit := range []int{0, 1} {
		for i := range all {
			part := NewAccount("a")
			part.HoldLimit, part.RefundLimit = limit, limit
			fold(t, part, all[:i+1])
			snap := viaSnapshot(t, part)
			if ok, diff := SameState(snap, part); !ok {
				t.Fatalf("limit %d, at %d: decoded snapshot differs: %s", limit, i, diff)
			}
			snap.HoldLimit, snap.RefundLimit = limit, limit
			if ok, diff := SameState(fold(t, snap, all[i+1:]), full); !ok {
				t.Fatalf("limit %d: from a snapshot at %d: %s", limit, i, diff)
			}
		}
	}
	b, err := EncodeSnapshot("account-a", full)
	if err != nil {
		t.Fatal(err)
	}
	for name, broken := range map[string]string{
		"tampered balance": strings.Replace(string(b), `"balance":45`, `"balance":46`, 1),
		"other version":    strings.Replace(string(b), `"v":3`, `"v":2`, 1),
		"other stream":     strings.Replace(string(b), `"stream":"account-a"`, `"stream":"account-b"`, 1),
	} {
		if broken == string(b) {
			t.Fatalf("%s: nothing replaced in %s", name, b)
		}
		if _, err := DecodeSnapshot("account-a", []byte(broken)); err == nil {
			t.Fatalf("%s: decoded", name)
		}
	}
	changed := fold(t, NewAccount("a"), all)
	changed.Holds["h2"].Status = HoldStatusActive
	if ok, _ := SameState(changed, full); ok {
		t.Fatal("SameState missed a hold's status")
	}
	if _, err := EncodeSnapshot("account-a", NewAccount("a")); err == nil {
		t.Fatal("a snapshot of no events")
	}
}

// TestUnclaimedStepsArePinned: where forgotten keys are found only by their
// claims (PinUnclaimedSteps), a saga step written without a claim of its own
// (before steps claimed their keys) is never forgotten, and does not count
// against KeyLimit; a claimed step and client keys are forgotten as usual.
func TestUnclaimedStepsArePinned(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, pin := range []bool{true, false} {
		a := NewAccount("a")
		a.KeyLimit, a.PinUnclaimedSteps = 2, pin
		cmds := []Command{{Type: CmdOpenAccount, IdempotencyKey: "open", AccountID: "a", Currency: "EUR"}}
		cmds = append(cmds, Command{Type: CmdTransferCredit, IdempotencyKey: "t1:credit", AccountID: "a", Amount: 10, HasAmount: true, Currency: "EUR", Origin: "t1", Reason: ReasonTransferIn})
		cmds = append(cmds, Command{Type: CmdTransferCredit, IdempotencyKey: "t2:credit", AccountID: "a", Amount: 10, HasAmount: true, Currency: "EUR", Origin: "t2", Reason: ReasonTransferIn, Claimed: true})
		for i := range 5 {
			cmds = append(cmds, Command{Type: CmdDeposit, IdempotencyKey: fmt.Sprintf("d%d", i), AccountID: "a", Amount: 1, HasAmount: true, Currency: "EUR"})
		}
		for _, cmd := range cmds {
			cmd.At = at
			d := DecideAccount(a, cmd)
			ev := storedOf(t, cmd, d.Events, 0, uint64(a.Revision+1), "p")
			ev.Metadata.Origin, ev.Metadata.Claimed = cmd.Origin, cmd.Claimed
			if err := EvolveAccount(a, ev); err != nil {
				t.Fatal(err)
			}
		}
		_, legacy := a.Keys["t1:credit"]
		_, claimed := a.Keys["t2:credit"]
		if legacy != pin || claimed || a.Keys["d4"] == nil || a.Keys["d3"] == nil || a.Keys["d2"] != nil || !a.Forgot() {
			t.Fatalf("pin %v: keys %v", pin, keysOf(a))
		}
		if a.Balance != 25 {
			t.Fatalf("pin %v: balance %d", pin, a.Balance)
		}
		a.ForgetKeys() // all at once: the pinned step still stays
		if _, legacy := a.Keys["t1:credit"]; legacy != pin || len(a.Keys) != a.Pinned() || !a.Forgot() {
			t.Fatalf("pin %v: keys after ForgetKeys %v", pin, keysOf(a))
		}
	}
}

// TestClosedHoldsAreBounded: an aggregate that keeps one closed hold forgets
// the older one, says so, and is still the state of the whole fold but for it
// (SameState; a snapshot of it too); the forgotten hold, recalled from its
// events, answers as it would have: hold_exists to a new placement,
// hold_not_active to a capture. A hold placed without a subject is never
// forgotten; SameState fails on an aggregate that lost a hold and does not say so.
func TestClosedHoldsAreBounded(t *testing.T) {
	all, _ := sampleStream(t)
	full := fold(t, NewAccount("a"), all)
	bounded := NewAccount("a")
	bounded.HoldLimit = 1
	fold(t, bounded, all)
	if _, kept := bounded.Holds["h1"]; kept || !bounded.ForgotHolds() || bounded.Holds["h2"] == nil {
		t.Fatalf("holds kept %v, forgot %v", bounded.Holds, bounded.ForgotHolds())
	}
	sameButForgotten(t, bounded, full, all, (*Account).ForgotHolds, func(a *Account) { delete(a.Holds, "h1") })

	// Recall h1 from its events, its placement and its capture.
	var h1 []StoredEvent
	for _, ev := range all {
		if ev.Metadata.Subject == HoldSubject("h1") {
			h1 = append(h1, ev)
		}
	}
	if len(h1) != 2 {
		t.Fatalf("h1's events: %d", len(h1))
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	place := Command{Type: CmdPlaceHold, IdempotencyKey: "n1", AccountID: "a", HoldID: "h1", Amount: 1, HasAmount: true, Currency: "EUR", At: at}
	capture := Command{Type: CmdCaptureHold, IdempotencyKey: "n2", AccountID: "a", HoldID: "h1", At: at}
	if d := DecideAccount(bounded, place); d.Rejection != nil {
		t.Fatalf("before the recall the aggregate cannot know h1: %+v", d.Rejection)
	}
	if err := bounded.RecallHold(h1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  Command
		code Code
	}{{place, CodeHoldExists}, {capture, CodeHoldNotActive}} {
		got, want := DecideAccount(bounded, c.cmd), DecideAccount(full, c.cmd)
		if got.Rejection == nil || got.Rejection.Code != c.code || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s after the recall: %+v, the full aggregate's %+v", c.cmd.Type, got, want)
		}
	}
	// The store shows h1 placed, not closed (its closure in flight): decide later.
	again := NewAccount("a")
	again.HoldLimit = 1
	fold(t, again, all)
	if err := again.RecallHold(h1[:1]); !errors.Is(err, ErrHoldInFlight) || again.Holds["h1"] != nil {
		t.Fatalf("recall of a placement alone: %v", err)
	}
	// The store shows an event of the hold beyond the aggregate's revision
	// (another instance's, not folded yet): decide again on the store's head,
	// where it is folded once, not recalled and then folded again.
	beyond := append([]StoredEvent(nil), h1...)
	beyond[1].Revision = uint64(again.Revision + 1)
	if err := again.RecallHold(beyond); !errors.Is(err, ErrRecallUnsettled) || again.Holds["h1"] != nil {
		t.Fatalf("recall of a hold closed beyond the aggregate: %v", err)
	}

	// Folded ahead of the store (a pipelined decision), a closed hold stays
	// until the event that closed it is durable.
	ahead := NewAccount("a")
	ahead.HoldLimit = 1
	foldAhead(t, ahead, all)
	ahead.ForgetDurable(-1)
	if ahead.Holds["h1"] == nil || ahead.Holds["h2"] == nil || ahead.ForgotHolds() {
		t.Fatalf("forgotten before durable: %v", ahead.Holds)
	}
	ahead.ForgetDurable(ahead.Revision)
	if ahead.Holds["h1"] != nil || ahead.Holds["h2"] == nil || !ahead.ForgotHolds() {
		t.Fatalf("durable: %v", ahead.Holds)
	}

	// Holds placed without a subject (before events had one) are never forgotten.
	old := NewAccount("a")
	old.HoldLimit = 1
	foldWithoutSubjects(t, old, all)
	if old.Holds["h1"] == nil || old.Holds["h2"] == nil || old.ForgotHolds() {
		t.Fatalf("holds without subjects: %v, forgot %v", old.Holds, old.ForgotHolds())
	}
	// A reader that never decides (ForgetUnfindableHolds, the audit's fold)
	// forgets them as the others, says so, and is the whole fold's state but
	// for them (SameState).
	reader := NewAccount("a")
	reader.HoldLimit, reader.ForgetUnfindableHolds = 1, true
	foldWithoutSubjects(t, reader, all)
	if reader.Holds["h1"] != nil || reader.Holds["h2"] == nil || !reader.ForgotHolds() {
		t.Fatalf("holds without subjects, a reader's: %v, forgot %v", reader.Holds, reader.ForgotHolds())
	}
	whole := NewAccount("a")
	foldWithoutSubjects(t, whole, all)
	if ok, diff := SameState(reader, whole); !ok {
		t.Fatalf("a reader that forgot holds without subjects: %s", diff)
	}
}

// TestRefundedOriginalsAreBounded: an aggregate that keeps one refunded
// original forgets the older one, says so, and is still the state of the
// whole fold but for it (SameState; a snapshot of it too); recalled from its
// refunds' events (found by their subject), the forgotten original refunds
// only what is left of it. A refund of it folded from the store while it is
// forgotten leaves it forgotten (the recall then counts it); a recall that
// meets a refund beyond the aggregate's revision asks to decide again. An
// entry stays until its last refund is durable; an original refunded without
// a subject is never forgotten, nor one that a snapshot written before
// refunds had subjects holds; SameState fails on an aggregate that lost one
// and does not say so.
func TestRefundedOriginalsAreBounded(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	all, _ := sampleStream(t)
	full := fold(t, NewAccount("a"), all)
	bounded := NewAccount("a")
	bounded.RefundLimit = 1
	fold(t, bounded, all)
	if _, kept := bounded.Refunded.Lookup("k1"); kept || !bounded.ForgotRefunds() || bounded.Refunded.Of("k2") != (RefundedSum{Amount: 30, Findable: true, rev: 10}) {
		t.Fatalf("refunded kept %v, forgot %v", bounded.Refunded, bounded.ForgotRefunds())
	}
	sameButForgotten(t, bounded, full, all, (*Account).ForgotRefunds, func(a *Account) { a.Refunded.Delete("k1") })
	if !viaSnapshot(t, bounded).Refunded.Of("k2").Findable {
		t.Fatal("a snapshot lost k2's findability")
	}

	// A refund of k1 decided elsewhere, folded from the store: k1 stays
	// forgotten, and a recall that stops short of it is refused.
	for _, more := range []Command{
		{Type: CmdDeposit, IdempotencyKey: "m0", AccountID: "a", Amount: 1000, HasAmount: true, Currency: "EUR", At: at},
		{Type: CmdRefund, IdempotencyKey: "m1", OriginalKey: "k1", Amount: 10, HasAmount: true, At: at},
	} {
		d := DecideAccount(full, more)
		ev := storedOf(t, more, d.Events, 0, uint64(full.Revision+1), "p"+more.IdempotencyKey)
		if err := EvolveAccount(full, ev); err != nil {
			t.Fatal(err)
		}
		all = append(all, ev)
	}
	fold(t, bounded, all[len(all)-2:len(all)-1])
	if err := bounded.RecallRefunded("k1", refundsOf(all, "k1")); !errors.Is(err, ErrRecallUnsettled) || bounded.Refunded.Of("k1") != (RefundedSum{}) {
		t.Fatalf("a recall that meets a refund beyond the aggregate: %v", err)
	}
	fold(t, bounded, all[len(all)-1:])
	if _, kept := bounded.Refunded.Lookup("k1"); kept {
		t.Fatalf("a refund of a forgotten original folded: %v", bounded.Refunded.Of("k1"))
	}
	refund := Command{Type: CmdRefund, IdempotencyKey: "n1", OriginalKey: "k1", Amount: 51, HasAmount: true, At: at}
	if d := DecideAccount(bounded, refund); d.Rejection != nil {
		t.Fatalf("before the recall the aggregate cannot know k1's refunds: %+v", d.Rejection)
	}
	if err := bounded.RecallRefunded("k1", refundsOf(all, "k1")); err != nil {
		t.Fatal(err)
	}
	for _, amount := range []int64{51, 50} {
		refund.Amount = amount
		got, want := DecideAccount(bounded, refund), DecideAccount(full, refund)
		if !reflect.DeepEqual(got, want) || (amount == 51) != (got.Rejection != nil && got.Rejection.Code == CodeRefundExceedsOriginal) {
			t.Fatalf("refund of %d after the recall: %+v, the full aggregate's %+v", amount, got, want)
		}
	}
	if ok, diff := SameState(bounded, full); !ok || bounded.Refunded.Of("k1").Amount != 50 {
		t.Fatalf("after the recall: %s", diff)
	}
	// An original never refunded is recalled as 0, for the refund decided next.
	if err := bounded.RecallRefunded("k99", nil); err != nil || bounded.Refunded.Of("k99") != (RefundedSum{Findable: true}) {
		t.Fatalf("recall of an original never refunded: %v, %v", err, bounded.Refunded.Of("k99"))
	}
	if ok, diff := SameState(bounded, full); !ok {
		t.Fatalf("with an entry of 0: %s", diff)
	}

	// Folded ahead of the store (a pipelined decision), an entry stays until
	// its last refund is durable: k1's at revision 9, k2's at 10.
	ahead := NewAccount("a")
	ahead.RefundLimit = 1
	foldAhead(t, ahead, all[:len(all)-1])
	for _, durable := range []int64{-1, 8} {
		ahead.ForgetDurable(durable)
		if ahead.Refunded.Len() != 2 || ahead.ForgotRefunds() {
			t.Fatalf("durable %d: forgotten before: %v", durable, ahead.Refunded)
		}
	}
	ahead.ForgetDurable(9)
	if _, kept := ahead.Refunded.Lookup("k1"); kept || ahead.Refunded.Of("k2").Amount != 30 || !ahead.ForgotRefunds() {
		t.Fatalf("durable: %v", ahead.Refunded)
	}

	// Refunds written without a subject (before refunds had one) are never
	// forgotten, nor are the originals of a snapshot taken of them (it lists
	// none findable, as every snapshot written before did).
	old := NewAccount("a")
	old.RefundLimit = 1
	foldWithoutSubjects(t, old, all)
	if old.Refunded.Of("k1") != (RefundedSum{Amount: 50, rev: 15}) || old.Refunded.Of("k2").Amount != 30 || old.ForgotRefunds() {
		t.Fatalf("refunds without subjects: %v, forgot %v", old.Refunded, old.ForgotRefunds())
	}
	b, err := EncodeSnapshot("account-a", old)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "findable_refunds") || strings.Contains(string(b), "forgot_refunds") {
		t.Fatalf("a snapshot of unfindable refunds: %s", b)
	}
	legacy := viaSnapshot(t, old)
	legacy.RefundLimit = 1
	legacy.ForgetDurable(legacy.Revision)
	if legacy.Refunded.Len() != 2 || legacy.Refunded.Of("k1").Findable || legacy.ForgotRefunds() {
		t.Fatalf("from a snapshot without findable refunds: %v", legacy.Refunded)
	}
	// A kept original refunded again without a subject (by an instance that
	// writes none yet) is kept for good.
	mixed := fold(t, NewAccount("a"), all[:len(all)-1])
	mixed.RefundLimit = 1
	foldWithoutSubjects(t, mixed, all[len(all)-1:])
	if mixed.Refunded.Len() != 2 || mixed.Refunded.Of("k1").Findable || !mixed.Refunded.Of("k2").Findable {
		t.Fatalf("refunded again without a subject: %v", mixed.Refunded)
	}
}

// sameButForgotten checks that bounded, which says it forgot (forgot), and
// its snapshot hold the state of full (the fold of all) but for what they
// forgot, and that SameState refuses the fold of all that lost a part (lose)
// without saying so.
func sameButForgotten(t *testing.T, bounded, full *Account, all []StoredEvent, forgot func(*Account) bool, lose func(*Account)) {
	t.Helper()
	if ok, diff := SameState(bounded, full); !ok {
		t.Fatalf("bounded vs full: %s", diff)
	}
	if snap := viaSnapshot(t, bounded); !forgot(snap) {
		t.Fatal("a snapshot of the bounded aggregate says it forgot nothing")
	} else if ok, diff := SameState(snap, full); !ok {
		t.Fatalf("snapshot of the bounded aggregate vs full: %s", diff)
	}
	lying := fold(t, NewAccount("a"), all)
	lose(lying)
	if ok, _ := SameState(lying, full); ok {
		t.Fatal("SameState took an aggregate that lost a part without saying so")
	}
}

// foldAhead folds evs as the ledger folds the decisions it writes, ahead of
// the store (EvolveAccountDecided: nothing is forgotten).
func foldAhead(t *testing.T, a *Account, evs []StoredEvent) {
	t.Helper()
	for _, ev := range evs {
		payload, err := DecodeEvent(ev.Type, ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if err := EvolveAccountDecided(a, ev, payload); err != nil {
			t.Fatal(err)
		}
	}
}

// foldWithoutSubjects folds evs as written before events had subjects.
func foldWithoutSubjects(t *testing.T, a *Account, evs []StoredEvent) {
	t.Helper()
	for _, ev := range evs {
		ev.Metadata.Subject = ""
		if err := EvolveAccount(a, ev); err != nil {
			t.Fatal(err)
		}
	}
}

// refundsOf is the refunds of an original among evs, found by their subject.
func refundsOf(evs []StoredEvent, originalKey string) []StoredEvent {
	var out []StoredEvent
	for _, ev := range evs {
		if ev.Metadata.Subject == RefundSubject(originalKey) {
			out = append(out, ev)
		}
	}
	return out
}
