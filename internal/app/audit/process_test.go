package audit_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
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
