package query_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestCommandQueryOfAtomicBatches: the commands read model answers an atomic
// batch's key (refused, and applied, its elements' replies filled from their
// rows) exactly as the ledger answers it from the event store, and the audit
// finds the read models equal to the fold.
func TestCommandQueryOfAtomicBatches(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	for _, c := range projtest.AtomicBatches {
		if r := env.Ledger.HandleBatch(ctx, []byte(c.Body), 0); string(r.Status) != c.Status {
			t.Fatalf("%+v", r)
		}
	}
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	svc := query.New(env.Pool, query.Options{})
	for _, key := range []string{"b1", "b2", "b3", "b4"} {
		raw, qerr := svc.Command(ctx, query.CommandRequest{IdempotencyKey: key})
		if qerr != nil {
			t.Fatalf("%s: %+v", key, qerr)
		}
		var got reply.Reply
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		want, err := env.Ledger.Lookup(ctx, key)
		if err != nil || want == nil {
			t.Fatalf("%s: %v %v", key, want, err)
		}
		if wb, _ := json.Marshal(want); !reflect.DeepEqual(got, *want) || string(raw) != string(wb) {
			t.Fatalf("%s from the read model:\n%s\nfrom the event store:\n%s", key, raw, wb)
		}
		if key == "b2" && (!got.Replies[0].Duplicate || got.Replies[1].Duplicate || got.Status != domain.StatusApplied) {
			t.Fatalf("b2: its first element was decided before it: %s", raw)
		}
	}
	projtest.AuditOK(t, env.Store, env.Pool)
}
