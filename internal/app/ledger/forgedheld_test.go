package ledger

import (
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// holdsOf is the state's hold id, as a forgery edits it.
func holdsOf(state map[string]any, id string) map[string]any {
	for _, h := range state["holds"].([]any) {
		if h := h.(map[string]any); h["id"] == id {
			return h
		}
	}
	panic("no hold " + id)
}

// forgedHolds edit the snapshot of heldAccount's a at its head (balance
// 4000, held 3000: h1 active, h2 captured) as no ledger writes it, and say
// what a cold load would then answer wrongly.
var forgedHolds = map[string]struct {
	edit      func(state map[string]any)
	typ, body string
	want      domain.Code // the true answer
}{
	"held 0, the hold active": { // 4000 available: the held 3000 withdrawn
		func(state map[string]any) { state["held"] = 0 },
		"withdraw", `{"idempotency_key":"w","account_id":"a","amount":2000,"currency":"EUR"}`, domain.CodeInsufficientFunds},
	"held above its holds": { // 0 available: a withdrawal of what is free refused
		func(state map[string]any) { state["held"] = 4000 },
		"withdraw", `{"idempotency_key":"w","account_id":"a","amount":1000,"currency":"EUR"}`, domain.CodeOK},
	"a captured hold active": { // h2 captured again
		func(state map[string]any) { holdsOf(state, "h2")["status"] = "active" },
		"capture_hold", `{"idempotency_key":"c2","account_id":"a","hold_id":"h2"}`, domain.CodeHoldNotActive},
	"a captured hold active, held too": { // held agrees with the holds: the event at the revision says h2 was captured, held 3000
		func(state map[string]any) { holdsOf(state, "h2")["status"], state["held"] = "active", 4000 },
		"capture_hold", `{"idempotency_key":"c2","account_id":"a","hold_id":"h2"}`, domain.CodeHoldNotActive},
}

// heldAccount makes account a: 5000 deposited, hold h1 of 3000 active, hold
// h2 of 1000 captured at its head.
func heldAccount(t *testing.T, s *Service) {
	t.Helper()
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"d0","account_id":"a","amount":5000,"currency":"EUR"}`)
	mustApply(t, s, "place_hold", `{"idempotency_key":"p1","account_id":"a","hold_id":"h1","amount":3000,"currency":"EUR"}`)
	mustApply(t, s, "place_hold", `{"idempotency_key":"p2","account_id":"a","hold_id":"h2","amount":1000,"currency":"EUR"}`)
	mustApply(t, s, "capture_hold", `{"idempotency_key":"c1","account_id":"a","hold_id":"h2"}`)
}

// TestColdLoadIgnoresAForgedHeld: a snapshot at the stream's head whose held
// is not its active holds' sum, or which shows a captured hold active, its
// hash taken again, is ignored by a cold load, which folds the stream from its
// start and answers as the stream says; on every store that keeps snapshots.
func TestColdLoadIgnoresAForgedHeld(t *testing.T) {
	for name, c := range forgedHolds {
		t.Run(name, func(t *testing.T) {
			onForgedSnapshot(t, devtest.AnyStore, func(s *Service) { heldAccount(t, s) }, c.edit, func(t *testing.T, cold *Service) {
				if r := post(t, cold, c.typ, c.body); r.Code != c.want {
					t.Fatalf("%s after a cold load from a forged snapshot: %+v, want %s", c.typ, r, c.want)
				}
				if counterValue(t, cold.metrics.snapshotsIgnored) != 1 {
					t.Fatal("the forged snapshot was not ignored")
				}
			})
		})
	}
}

// TestColdLoadFromAnHonestSnapshotWithHolds: the snapshot the ledger itself
// takes of an account holding a client's hold, a hold captured in part, a
// capture saga's guard of 0 and a transaction's reservation (each saga
// stopped after its step on a) is loaded: not ignored, and the account's
// available is its balance less its holds. On the stores that run captures
// and transactions as sagas and keep snapshots (KurrentDB).
func TestColdLoadFromAnHonestSnapshotWithHolds(t *testing.T) {
	onForgedSnapshot(t, devtest.SingleAppend, func(s *Service) {
		for _, acc := range []string{"a", "b"} {
			mustApply(t, s, "open_account", `{"idempotency_key":"o-`+acc+`","account_id":"`+acc+`","currency":"EUR"}`)
			mustApply(t, s, "deposit", `{"idempotency_key":"d-`+acc+`","account_id":"`+acc+`","amount":1000,"currency":"EUR"}`)
		}
		mustApply(t, s, "place_hold", `{"idempotency_key":"p1","account_id":"a","hold_id":"h1","amount":200,"currency":"EUR"}`)
		mustApply(t, s, "place_hold", `{"idempotency_key":"p2","account_id":"a","hold_id":"h2","amount":100,"currency":"EUR"}`)
		mustApply(t, s, "capture_hold", `{"idempotency_key":"c2","account_id":"a","hold_id":"h2","amount":40}`)
		mustApply(t, s, "place_hold", `{"idempotency_key":"pb","account_id":"b","hold_id":"hb","amount":300,"currency":"EUR"}`)
		crashAt(s, "capture/guard")
		if r := post(t, s, "capture_hold", `{"idempotency_key":"cb","account_id":"b","hold_id":"hb","to":"a"}`); r.Status == domain.StatusApplied {
			t.Fatalf("the capture went past its guard: %+v", r)
		}
		crashAt(s, "transaction/reserve:a")
		if r := post(t, s, "post_transaction", `{"idempotency_key":"x","transaction_id":"t1","postings":[{"from":"a","to":"b","amount":50,"currency":"EUR"}]}`); r.Status == domain.StatusApplied {
			t.Fatalf("the transaction went past its reservation on a: %+v", r)
		}
	}, func(state map[string]any) { // the ledger's own snapshot, unedited
		if holds := state["holds"].([]any); len(holds) != 4 || state["held"] != float64(250) {
			t.Fatalf("a holds %v in %v, want 250 in h1, h2, the guard and the reservation", state["held"], holds)
		}
	}, func(t *testing.T, cold *Service) {
		if r := post(t, cold, "withdraw", `{"idempotency_key":"w1","account_id":"a","amount":711,"currency":"EUR"}`); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("a withdrawal of 711 of 710 available: %+v", r)
		}
		mustApply(t, cold, "withdraw", `{"idempotency_key":"w2","account_id":"a","amount":710,"currency":"EUR"}`)
		if counterValue(t, cold.metrics.snapshotsIgnored) != 0 {
			t.Fatal("the ledger's own snapshot was ignored")
		}
	})
}

// TestColdLoadIgnoresSwappedHolds (from the review of 80bd5a9): two holds of the same amount, h2
// captured at the head, h1 active. A snapshot at the head, its hash taken
// again, showing h2 active and h1 released keeps held (1000) equal to its
// active holds' sum and to the head event's held_after, and the balance: only
// SnapshotAgreesWithHead's hold-status branch refuses it. Loaded, h2 would be
// captured a second time (1000 debited twice) and h1 refused.
func TestColdLoadIgnoresSwappedHolds(t *testing.T) {
	onForgedSnapshot(t, devtest.AnyStore, func(s *Service) {
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"d0","account_id":"a","amount":5000,"currency":"EUR"}`)
		mustApply(t, s, "place_hold", `{"idempotency_key":"p1","account_id":"a","hold_id":"h1","amount":1000,"currency":"EUR"}`)
		mustApply(t, s, "place_hold", `{"idempotency_key":"p2","account_id":"a","hold_id":"h2","amount":1000,"currency":"EUR"}`)
		mustApply(t, s, "capture_hold", `{"idempotency_key":"c1","account_id":"a","hold_id":"h2"}`)
	}, func(state map[string]any) {
		holdsOf(state, "h2")["status"], holdsOf(state, "h1")["status"] = "active", "released"
	}, func(t *testing.T, cold *Service) {
		r := post(t, cold, "capture_hold", `{"idempotency_key":"c2","account_id":"a","hold_id":"h2"}`)
		if r.Code != domain.CodeHoldNotActive {
			t.Fatalf("h2 (captured) captured again after a cold load from a snapshot showing it active: %+v", r)
		}
		if counterValue(t, cold.metrics.snapshotsIgnored) != 1 {
			t.Fatal("the forged snapshot was not ignored")
		}
	})
}
