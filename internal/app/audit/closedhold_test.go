package audit

import (
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestClosedHoldThroughCheckpointRows: an account's last closed hold, which
// the fold keeps as its ID, status and digest only (forgetClosedHold), goes
// into its checkpoint row as a stub of them and comes back from it as the
// fold keeps it (restoreClosedHold); a row stored by 017808d, which carries
// the whole closed hold, comes back alike; and a row of this build resumed by
// 017808d, which keeps the stub beside the whole hold it closed after, comes
// back with the later one, every time (not as a map's order has it).
func TestClosedHoldThroughCheckpointRows(t *testing.T) {
	stream := domain.AccountStream("c-1")
	active := &domain.Hold{ID: "active", Amount: 5, Status: domain.HoldStatusActive, Key: "k-active", Findable: true}
	closed := &domain.Hold{ID: "closed", Amount: 9, Status: domain.HoldStatusCaptured, Key: "k-closed", Findable: true}
	account := func(holds ...*domain.Hold) *domain.Account {
		a := domain.NewAccount("c-1")
		boundAccount(a)
		a.Opened, a.Currency, a.Revision = true, "EUR", 7
		for _, h := range holds {
			a.SetHold(h)
			if h.Status == domain.HoldStatusActive {
				a.Held += h.Amount // as the fold keeps it (domain.DecodeSnapshot checks)
			}
		}
		return a
	}
	now := &streamState{next: 8, closedHold: "closed", closedStatus: domain.HoldStatusCaptured, closedDigest: digestHold(closed), closedFindable: true}
	// 017808d resumed this build's row (a stub of "earlier") and closed
	// "closed" after it, keeping both (the stub is unfindable).
	mixed := account(active, holdStub(&streamState{closedHold: "earlier", closedStatus: domain.HoldStatusReleased, closedDigest: digestHold(&domain.Hold{ID: "earlier", Amount: 3})}), closed)
	for name, row := range map[string]struct {
		a  *domain.Account
		ss *streamState
	}{"this build's": {account(active), now}, "017808d's": {account(active, closed), &streamState{next: 8}}, "this build's resumed by 017808d": {mixed, &streamState{next: 8}}} {
		snap, err := accountSnapshot(stream, row.a, row.ss)
		if err != nil {
			t.Fatal(err)
		}
		if h := row.a.Holds["closed"]; row.ss == now && h != nil {
			t.Fatalf("%s row: the account keeps the closed hold after its row is encoded", name)
		}
		for range 20 {
			back, err := domain.DecodeSnapshot(stream, snap)
			if err != nil {
				t.Fatal(err)
			}
			boundAccount(back)
			ss := &streamState{next: 8}
			restoreClosedHold(back, ss)
			if ss.closedHold != "closed" || ss.closedStatus != domain.HoldStatusCaptured || ss.closedDigest != digestHold(closed) || !ss.closedFindable {
				t.Fatalf("%s row: closed hold %q %q %x restored, want \"closed\" captured %x", name, ss.closedHold, ss.closedStatus, ss.closedDigest, digestHold(closed))
			}
			if h := back.Holds["active"]; len(back.Holds) != 1 || h == nil || h.Amount != 5 || h.Key != "k-active" {
				t.Fatalf("%s row: holds %v restored, want the active one only", name, back.Holds)
			}
			if want := row.a == mixed; back.ForgotHolds() != want {
				t.Fatalf("%s row: restored account says it forgot holds: %v, want %v", name, back.ForgotHolds(), want)
			}
		}
	}
}

// closedHoldHistory is one account's stream that places hold h-1, releases
// it and deposits after, and the account its events fold to, as the ledger
// keeps it (every hold).
func closedHoldHistory(t *testing.T) ([]eventstore.RecordedEvent, *domain.Account) {
	h := newBoundedHistory(1)
	a := h.accs[0]
	h.emit(a, domain.CmdDeposit, domain.EvCredited, domain.Credited{Amount: 100, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: 100})
	h.emit(a, domain.CmdPlaceHold, domain.EvHoldPlaced, domain.HoldPlaced{HoldID: "h-1", Amount: 40, Currency: "EUR", HeldAfter: 40})
	h.emit(a, domain.CmdReleaseHold, domain.EvHoldReleased, domain.HoldReleased{HoldID: "h-1", Amount: 40, Reason: domain.ReasonHoldReleased})
	h.emit(a, domain.CmdDeposit, domain.EvCredited, domain.Credited{Amount: 1, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: 101})
	evs := h.next(0)
	stored := domain.NewAccount(a.id)
	for _, re := range evs {
		devtest.EvolveRecorded(t, stored, re)
	}
	return evs, stored
}

// foldWithSnapshot folds evs with snap, a snapshot at their last revision,
// to check.
func foldWithSnapshot(evs []eventstore.RecordedEvent, snap []byte) *Fold {
	f := NewFold()
	f.sets = noSets{}
	f.CheckSnapshots([]eventstore.Snapshot{{Stream: evs[0].Stream, Revision: evs[len(evs)-1].Revision, Data: snap}})
	for _, re := range evs {
		f.Apply(re)
	}
	return f
}

// TestSnapshotOfForgottenClosedHold: a snapshot past an account's last
// closed hold, which the fold keeps as its ID, status and digest only, is
// checked against them: a snapshot whose copy of the hold differs in any
// field, lacks it while it says it forgot no hold, or has a closed hold the
// stream never placed is named; the true one is not. (Loaded by the ledger,
// each wrong one would decide place_hold h-1 under a new key wrongly: apply
// it where hold_exists is due, or the reverse.)
func TestSnapshotOfForgottenClosedHold(t *testing.T) {
	for name, corrupt := range map[string]func(a *domain.Account){
		"true":                func(a *domain.Account) {},
		"status captured":     func(a *domain.Account) { a.Holds["h-1"].Status = domain.HoldStatusCaptured },
		"amount 40->39":       func(a *domain.Account) { a.Holds["h-1"].Amount = 39 },
		"key altered":         func(a *domain.Account) { a.Holds["h-1"].Key = "other-key" },
		"findable toggled":    func(a *domain.Account) { a.Holds["h-1"].Findable = !a.Holds["h-1"].Findable },
		"closed hold deleted": func(a *domain.Account) { delete(a.Holds, "h-1") },
		"closed hold deleted, the snapshot saying it forgot holds": func(a *domain.Account) { delete(a.Holds, "h-1") }, // h-1 is not findable
		"phantom closed hold": func(a *domain.Account) {
			a.SetHold(&domain.Hold{ID: "h-ghost", Amount: 7, Status: domain.HoldStatusReleased, Key: "k-ghost", Findable: true})
		},
	} {
		evs, stored := closedHoldHistory(t)
		corrupt(stored)
		snap, err := domain.EncodeSnapshot(evs[0].Stream, stored)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(name, "forgot holds") {
			snap = sayForgotHolds(t, snap)
		}
		f := foldWithSnapshot(evs, snap)
		named := f.ViolationCount() == 1 && f.Violations[0].Kind == "snapshot_mismatch"
		if want := name != "true"; named != want || (!want && f.ViolationCount() != 0) {
			t.Errorf("a snapshot with its closed hold %s: violations %v, want the mismatch named: %v", name, f.Violations, want)
		}
	}
}

// sayForgotHolds is snap with its state saying it forgot holds, its hash
// recomputed.
func sayForgotHolds(t *testing.T, snap []byte) []byte {
	return devtest.ForgeSnapshotState(t, snap, func(st map[string]any) { st["forgot_holds"] = true })
}
