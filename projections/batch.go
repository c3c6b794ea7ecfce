package projections

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
)

// slot is one projection's generation and its checkpoint, as the runner or a
// builder last committed it.
type slot struct {
	proj   Projection
	gen    int
	pos    eventstore.Position
	events int64 // events consumed by this generation
}

// ErrCheckpointMoved means a batch's compare-and-set found a checkpoint other than
// the one the batch was read from: another runner applied it, or a rebuild
// switched generations. Nothing was written; reload the checkpoints.
var ErrCheckpointMoved = errors.New("projections: checkpoint moved (another runner or a switch)")

// Hook runs inside a batch's transaction after the read-model writes and before
// the commit. Returning an error rolls the batch back: tests use it as a failpoint
// ("the process died between its write and its checkpoint").
type Hook func(ctx context.Context, tx pgx.Tx) error

const casSQL = `UPDATE readmodel.checkpoints
SET commit_position = $3, prepare_position = $4, events = events + $7, updated_at = now()
WHERE name = $1 AND generation = $2 AND commit_position = $5 AND prepare_position = $6`

// applyBatch applies events to every slot whose checkpoint is before the batch's
// end, in one transaction: first the compare-and-set of each slot's checkpoint
// (in slot order, so that two runners lock the rows in the same order and the
// loser waits, then finds the checkpoint moved), then the read-model writes, then
// hook, then the commit. On success the slots' checkpoints are advanced in memory.
func applyBatch(ctx context.Context, pool *pgxpool.Pool, slots []*slot, events []*Event, hook Hook) error {
	if len(events) == 0 {
		return nil
	}
	end := events[len(events)-1].Position
	type part struct {
		s      *slot
		events []*Event
	}
	var parts []part
	for _, s := range slots {
		if s.pos.Compare(end) >= 0 {
			continue
		}
		i := 0
		for i < len(events) && events[i].Position.Compare(s.pos) <= 0 {
			i++
		}
		parts = append(parts, part{s, events[i:]})
	}
	if len(parts) == 0 {
		return nil
	}
	endC, endP, err := posArgs(end)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("projections: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	b := &pgx.Batch{}
	for _, p := range parts {
		oc, op, err := posArgs(p.s.pos)
		if err != nil {
			return err
		}
		b.Queue(casSQL, p.s.proj.Name(), p.s.gen, endC, endP, oc, op, int64(len(p.events)))
	}
	br := tx.SendBatch(ctx, b)
	moved := false
	for range parts {
		ct, err := br.Exec()
		if err != nil {
			br.Close()
			return fmt.Errorf("projections: checkpoint: %w", err)
		}
		if ct.RowsAffected() != 1 {
			moved = true
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("projections: checkpoint: %w", err)
	}
	if moved {
		return ErrCheckpointMoved
	}
	for _, p := range parts {
		if err := p.s.proj.Apply(ctx, tx, p.s.gen, p.events); err != nil {
			return err
		}
	}
	if hook != nil {
		if err := hook(ctx, tx); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("projections: commit: %w", err)
	}
	for _, p := range parts {
		p.s.pos = end
		p.s.events += int64(len(p.events))
	}
	return nil
}

// minPos is the earliest checkpoint of the slots: where the next read starts.
func minPos(slots []*slot) eventstore.Position {
	if len(slots) == 0 {
		return eventstore.Start
	}
	m := slots[0].pos
	for _, s := range slots[1:] {
		if s.pos.Compare(m) < 0 {
			m = s.pos
		}
	}
	return m
}
