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
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditAtomicBatches: the history of atomic batches, applied and refused,
// folds without violations; the same history without the claim of an element
// of an applied batch is named batch_element_undecided.
func TestAuditAtomicBatches(t *testing.T) {
	st := devtest.Memory(t)
	s := ledger.New(st, ledger.Options{})
	defer s.Close()
	ctx := context.Background()
	for _, c := range projtest.AtomicBatches {
		if r := s.HandleBatch(ctx, []byte(c.Body), 0); string(r.Status) != c.Status {
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
