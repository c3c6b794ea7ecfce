package audit

import (
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// TestClosedHoldThroughCheckpointRows: an account's last closed hold, which
// the fold keeps as its ID and status only (forgetClosedHold), goes into its
// checkpoint row as a hold of that ID and status and comes back from it as
// the fold keeps it (restoreClosedHold); a row stored before, which carries
// the whole closed hold, comes back alike.
func TestClosedHoldThroughCheckpointRows(t *testing.T) {
	stream := domain.AccountStream("c-1")
	a := domain.NewAccount("c-1")
	boundAccount(a)
	a.Opened, a.Currency, a.Revision = true, "EUR", 7
	a.Holds["active"] = &domain.Hold{ID: "active", Amount: 5, Status: domain.HoldStatusActive, Key: "k-active", Findable: true}
	now := &streamState{next: 8, closedHold: "closed", closedStatus: domain.HoldStatusCaptured}
	old := domain.NewAccount("c-1")
	boundAccount(old)
	old.Opened, old.Currency, old.Revision = true, "EUR", 7
	old.Holds["active"] = a.Holds["active"]
	old.Holds["closed"] = &domain.Hold{ID: "closed", Amount: 9, Status: domain.HoldStatusCaptured, Key: "k-closed", Findable: true}
	for name, row := range map[string]struct {
		a  *domain.Account
		ss *streamState
	}{"this build's": {a, now}, "an earlier build's": {old, &streamState{next: 8}}} {
		snap, err := accountSnapshot(stream, row.a, row.ss)
		if err != nil {
			t.Fatal(err)
		}
		if _, in := a.Holds["closed"]; in {
			t.Fatalf("%s row: the account keeps the closed hold after its row is encoded", name)
		}
		back, err := domain.DecodeSnapshot(stream, snap)
		if err != nil {
			t.Fatal(err)
		}
		boundAccount(back)
		ss := &streamState{next: 8}
		restoreClosedHold(back, ss)
		if ss.closedHold != "closed" || ss.closedStatus != domain.HoldStatusCaptured {
			t.Errorf("%s row: closed hold %q %q restored, want \"closed\" captured", name, ss.closedHold, ss.closedStatus)
		}
		if h := back.Holds["active"]; len(back.Holds) != 1 || h == nil || h.Amount != 5 || h.Key != "k-active" {
			t.Errorf("%s row: holds %v restored, want the active one only", name, back.Holds)
		}
	}
}

// TestSnapshotOfForgottenClosedHold: a snapshot past an account's last
// closed hold, which the fold keeps as its ID and status only, is checked
// against that status: a snapshot that says the hold was captured when its
// stream released it is named, the true one is not.
func TestSnapshotOfForgottenClosedHold(t *testing.T) {
	h := newBoundedHistory(1)
	a := h.accs[0]
	h.emit(a, domain.CmdDeposit, domain.EvCredited, domain.Credited{Amount: 100, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: 100})
	h.emit(a, domain.CmdPlaceHold, domain.EvHoldPlaced, domain.HoldPlaced{HoldID: "h-1", Amount: 40, Currency: "EUR", HeldAfter: 40})
	h.emit(a, domain.CmdReleaseHold, domain.EvHoldReleased, domain.HoldReleased{HoldID: "h-1", Amount: 40, Reason: domain.ReasonHoldReleased})
	h.emit(a, domain.CmdDeposit, domain.EvCredited, domain.Credited{Amount: 1, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: 101})
	evs := h.next(0)
	stored := domain.NewAccount(a.id)
	for _, re := range evs {
		m, err := domain.DecodeMetadata(re.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		if err := domain.EvolveAccount(stored, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Type: re.Type, Data: re.Data, Metadata: m}); err != nil {
			t.Fatal(err)
		}
	}
	for _, status := range []domain.HoldStatus{domain.HoldStatusReleased, domain.HoldStatusCaptured} {
		stored.Holds["h-1"].Status = status
		snap, err := domain.EncodeSnapshot(evs[0].Stream, stored)
		if err != nil {
			t.Fatal(err)
		}
		f := NewFold()
		f.sets = noSets{}
		f.CheckSnapshots([]eventstore.Snapshot{{Stream: evs[0].Stream, Revision: evs[len(evs)-1].Revision, Data: snap}})
		for _, re := range evs {
			f.Apply(re)
		}
		named := f.ViolationCount() == 1 && f.Violations[0].Kind == "snapshot_mismatch"
		if want := status != domain.HoldStatusReleased; named != want || (!want && f.ViolationCount() != 0) {
			t.Errorf("a snapshot with the closed hold %s: violations %v, want the mismatch named: %v", status, f.Violations, want)
		}
	}
}
