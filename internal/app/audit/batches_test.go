package audit_test

import (
	"context"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestAuditAtomicBatches: the history of atomic batches, applied and refused,
// folds without violations; the same history without the claim of an element
// of an applied batch is named batch_element_undecided.
func TestAuditAtomicBatches(t *testing.T) {
	st := devtest.Memory(t)
	s := ledger.New(st, ledger.Options{})
	defer s.Close()
	ctx := context.Background()
	for _, c := range []struct{ body, status string }{
		{`{"atomic":true,"idempotency_key":"b1","commands":[
			{"type":"open_account","idempotency_key":"o-a","account_id":"a","currency":"EUR"},
			{"type":"deposit","idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"},
			{"type":"open_account","idempotency_key":"o-b","account_id":"b","currency":"EUR"},
			{"type":"transfer","idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"},
			{"type":"post_transaction","idempotency_key":"x-1","transaction_id":"x-1","postings":[{"from":"b","to":"a","amount":10,"currency":"EUR"}]}]}`, "applied"},
		{`{"atomic":true,"idempotency_key":"b2","commands":[
			{"type":"deposit","idempotency_key":"d-b","account_id":"b","amount":1,"currency":"EUR"},
			{"type":"withdraw","idempotency_key":"w-a","account_id":"a","amount":1000,"currency":"EUR"}]}`, "rejected"},
	} {
		if r := s.HandleBatch(ctx, []byte(c.body), 0); string(r.Status) != c.status {
			t.Fatalf("%+v", r)
		}
	}
	all := devtest.ReadAll(t, st)
	fold := func(evs []eventstore.RecordedEvent) *audit.Fold {
		f := audit.NewFold()
		for _, re := range evs {
			f.Apply(re)
		}
		f.Finish()
		return f
	}
	if f := fold(all); f.ViolationCount() != 0 {
		t.Fatalf("atomic batches: %v", f.Violations)
	}
	broken := slices.DeleteFunc(slices.Clone(all), func(re eventstore.RecordedEvent) bool { return re.Stream == domain.KeyStream("o-b") })
	f := fold(broken)
	if !slices.ContainsFunc(f.Violations, func(v audit.Violation) bool { return v.Kind == "batch_element_undecided" }) {
		t.Fatalf("an applied batch's element without its claim: %v", f.Violations)
	}
}
