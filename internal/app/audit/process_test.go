package audit_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// The transfer process checkpoints into the event store; its stream is the
// ledger's own, not an unknown one.
func TestAuditAcceptsTransferProcessCheckpoints(t *testing.T) {
	ctx := context.Background()
	st := memory.New()
	svc := ledger.New(st, ledger.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, c := range []struct{ typ, body string }{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`},
		{"transfer", `{"idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"}`},
	} {
		if r := svc.HandleRaw(ctx, c.typ, []byte(c.body)); r.Status != "applied" {
			t.Fatalf("%s: %+v", c.typ, r)
		}
	}
	if _, err := ledger.NewProcess(svc, st, ledger.ProcessOptions{}).Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if evs, err := st.ReadStream(ctx, "ledger-process-checkpoint", 0, eventstore.Forwards, 0); err != nil || len(evs) != 1 {
		t.Fatalf("checkpoints: %d, %v", len(evs), err)
	}
	rep, err := audit.Run(ctx, st, audit.Options{VerifyChain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("violations: %v", rep.Violations)
	}
}

// sagaCommand is a command and the status it must get.
type sagaCommand struct{ typ, body, status string }

// sagaLog sends commands to a ledger whose store has no multi-stream append,
// checks that the audit (the chain verified) finds nothing, and returns the
// log ("all").
func sagaLog(t *testing.T, cmds []sagaCommand) []eventstore.RecordedEvent {
	t.Helper()
	ctx := context.Background()
	st := memory.New()
	svc := ledger.New(devtest.WithoutMultiAppend(st), ledger.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, c := range cmds {
		if r := svc.HandleRaw(ctx, c.typ, []byte(c.body)); string(r.Status) != c.status {
			t.Fatalf("%s: %+v", c.body, r)
		}
	}
	rep, err := audit.Run(ctx, st, audit.Options{VerifyChain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("violations: %v", rep.Violations)
	}
	all, err := st.ReadAll(ctx, eventstore.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// TestAuditFoldsReservationSagas: transactions decided as reservation sagas
// (a posted one and a refused one) pass the audit with the chain verified;
// the same log cut before a saga's outcome (its legs partly posted) counts
// the saga as pending with its money in flight, not as a violation; and an
// event after a transaction's outcome is one.
func TestAuditFoldsReservationSagas(t *testing.T) {
	all := sagaLog(t, []sagaCommand{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`, "applied"},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`, "applied"},
		{"post_transaction", `{"idempotency_key":"tx-1","transaction_id":"tx-1","postings":[{"from":"a","to":"b","amount":40,"currency":"EUR"},{"from":"b","to":"a","amount":5,"currency":"EUR"}]}`, "applied"},
		{"post_transaction", `{"idempotency_key":"tx-2","transaction_id":"tx-2","postings":[{"from":"a","to":"b","amount":4000,"currency":"EUR"}]}`, "rejected"},
	})
	// Cut the log right after tx-1's first leg write (a's): b's legs and the outcome are not written yet.
	cut := -1
	for i, re := range all {
		if re.Stream == "account-a" && re.Type == "HoldReleased" {
			cut = i
			break
		}
	}
	f := audit.NewFold()
	for _, re := range all[:cut+3] { // the release and a's two legs
		f.Apply(re)
	}
	totals := f.Finish()
	if f.ViolationCount() != 0 || len(totals) != 1 || totals[0].PendingSaga != 1 || totals[0].InFlight != 35 {
		t.Fatalf("cut mid-saga: %d violations %v, totals %+v", f.ViolationCount(), f.Violations, totals)
	}
	// An event after tx-1's outcome (a second outcome, forged) is named.
	f = audit.NewFold()
	var outcome eventstore.RecordedEvent
	for _, re := range all {
		f.Apply(re)
		if re.Stream == "transaction-tx-1" {
			outcome = re
		}
	}
	forged := outcome
	forged.ID, forged.Revision, forged.Position = uuid.New(), outcome.Revision+1, all[len(all)-1].Position
	forged.Position.Commit++
	forged.Position.Prepare++
	f.Apply(forged)
	f.Finish()
	if !slices.ContainsFunc(f.Violations, func(v audit.Violation) bool { return v.Kind == "transaction_rewritten" }) {
		t.Fatalf("an event after the outcome: %v", f.Violations)
	}
}

// TestAuditFoldsCaptureSagas: captures into an account decided as capture
// sagas (one applied in part, one refused by `to`, one by the held account)
// pass the audit with the chain verified; the same log cut right after the
// capture, before its credit, counts the saga as pending with what it captured
// in flight, not as a violation; cut after the credit, before the guard's
// release, it is still pending with nothing in flight.
func TestAuditFoldsCaptureSagas(t *testing.T) {
	all := sagaLog(t, []sagaCommand{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-u","account_id":"u","currency":"USD"}`, "applied"},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`, "applied"},
		{"place_hold", `{"idempotency_key":"h-1","account_id":"a","hold_id":"h1","amount":60,"currency":"EUR"}`, "applied"},
		{"capture_hold", `{"idempotency_key":"c-0","account_id":"a","hold_id":"h1","amount":40,"to":"u"}`, "rejected"},
		{"capture_hold", `{"idempotency_key":"c-1","account_id":"a","hold_id":"h1","amount":40,"to":"b"}`, "applied"},
		{"capture_hold", `{"idempotency_key":"c-2","account_id":"a","hold_id":"h1","to":"b"}`, "rejected"},
	})
	at := func(stream, typ string) int {
		for i, re := range all {
			if re.Stream == stream && re.Type == typ {
				return i
			}
		}
		t.Fatalf("no %s in %s", typ, stream)
		return 0
	}
	for _, c := range []struct {
		cut      int
		inFlight int64
	}{
		{at("account-a", "HoldCaptured"), 40}, // captured, not credited
		{at("account-b", "Credited"), 0},      // credited, the guard not released
	} {
		f := audit.NewFold()
		for _, re := range all[:c.cut+1] {
			f.Apply(re)
		}
		totals := f.Finish()
		if f.ViolationCount() != 0 || len(totals) != 2 || totals[0].Currency != "EUR" || totals[0].PendingSaga != 1 || totals[0].InFlight != c.inFlight {
			t.Fatalf("cut at %d: %d violations %v, totals %+v", c.cut, f.ViolationCount(), f.Violations, totals)
		}
	}
}
