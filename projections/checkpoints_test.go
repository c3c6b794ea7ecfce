package projections_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditCheckpointsKept: the audit checkpoints stored are bounded; the
// oldest beyond AuditCheckpointsKept are dropped as a new one is saved, and
// asking for a dropped one is ErrNoAuditCheckpoint.
func TestAuditCheckpointsKept(t *testing.T) {
	env := projtest.New(t)
	ctx := context.Background()
	var ids []int64
	for i := range projections.AuditCheckpointsKept + 2 {
		id, err := projections.Checkpoints.SaveAudit(ctx, env.Pool, projections.AuditCheckpoint{
			Position: eventstore.Position{Commit: uint64(i), Prepare: uint64(i)}, Events: int64(i), State: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var n int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM readmodel.audit_checkpoints`).Scan(&n); err != nil || n != projections.AuditCheckpointsKept {
		t.Fatalf("%d checkpoints kept (%v), want %d", n, err, projections.AuditCheckpointsKept)
	}
	for _, id := range ids[:2] {
		if _, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, id); !errors.Is(err, projections.ErrNoAuditCheckpoint) {
			t.Fatalf("checkpoint %d, dropped: %v", id, err)
		}
	}
	kept, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, ids[2])
	if err != nil || kept.Events != 2 || kept.State[0] != 2 {
		t.Fatalf("checkpoint %d: %+v, %v", ids[2], kept, err)
	}
	last, err := projections.Checkpoints.LoadAudit(ctx, env.Pool, 0)
	if want := int64(len(ids) - 1); err != nil || last.ID != ids[len(ids)-1] || last.Events != want || last.Position.Prepare != uint64(want) {
		t.Fatalf("the last checkpoint: %+v, %v", last, err)
	}
}
