package audit_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditAtomicBatches: the history of atomic batches, applied and refused
// (by a rejected element, and by an invalid one), folds without violations;
// the same history without the claim of an element of an applied batch is
// named batch_element_undecided, and with a refused batch's decision whose
// status or code is not its refusing element's (reply.BatchDecided), bad_claim.
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
	for key, forge := range map[string]func(*domain.BatchDecided){
		"b3": func(d *domain.BatchDecided) { d.Code = domain.CodeAccountNotFound },
		"b4": func(d *domain.BatchDecided) { d.Status = domain.StatusRejected },
	} {
		forged := slices.Clone(all)
		i := slices.IndexFunc(forged, func(re eventstore.RecordedEvent) bool { return re.Stream == domain.KeyStream(key) })
		var d domain.BatchDecided
		if i < 0 || json.Unmarshal(forged[i].Data, &d) != nil {
			t.Fatalf("%s: no decision", key)
		}
		forge(&d)
		forged[i].Data, _ = json.Marshal(d)
		if f := fold(forged); !slices.ContainsFunc(f.Violations, func(v audit.Violation) bool { return v.Kind == "bad_claim" && v.Stream == domain.KeyStream(key) }) {
			t.Fatalf("%s: a decision not its refusing element's: %v", key, f.Violations)
		}
	}
}
