package projections

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
	// memo: a rebuild's builder's memo of its generation's accounts (nil
	// otherwise: a live generation has other writers, the switch's catch-up).
	memo *accountMemo
	// held: the accounts builder's rows held until their release
	// (heldAccounts; nil otherwise), its checkpoint as stored in held.
	held *heldAccounts
	// spoiled: a batch was folded into the builder's memory (its held rows,
	// its memo) and did not commit: what it holds is ahead of its checkpoint.
	spoiled bool
}

// ErrCheckpointMoved means a batch's compare-and-set found a checkpoint other than
// the one the batch was read from: another runner applied it, or a rebuild
// switched generations. Nothing was written; reload the checkpoints.
var ErrCheckpointMoved = errors.New("projections: checkpoint moved (another runner or a switch)")

// Hook runs inside a batch's transaction after the read-model writes and before
// the commit. Returning an error rolls the batch back: tests use it as a failpoint
// ("the process died between its write and its checkpoint").
type Hook func(ctx context.Context, tx pgx.Tx) error

// applyBatch applies a batch to every slot whose checkpoint is before the batch's
// end. Each slot's rows and its checkpoint commit in one transaction of their own,
// and the slots' transactions run in parallel (each projection owns its
// checkpoint, so they need not wait for one another). On success a slot's
// checkpoint is advanced in memory; on failure it is left as it was (the caller
// reloads from the database).
func applyBatch(ctx context.Context, pool *pgxpool.Pool, slots []*slot, events []*Event, hook Hook) error {
	if len(events) == 0 {
		return nil
	}
	end := events[len(events)-1].Position
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, s := range slots {
		if s.pos.Compare(end) >= 0 {
			continue
		}
		i := 0
		for i < len(events) && events[i].Position.Compare(s.pos) <= 0 {
			i++
		}
		wg.Add(1)
		go func(s *slot, evs []*Event) {
			defer wg.Done()
			if err := applySlot(ctx, pool, s, evs, hook); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}(s, events[i:])
	}
	wg.Wait()
	return errors.Join(errs...)
}

// applySlot applies events (at least one) to one slot in one transaction:
// first the compare-and-set of its checkpoint to the last event's position
// (so that a second runner waits on the row lock and then finds the
// checkpoint moved, before any work), then the read-model writes, then hook,
// then the commit. A builder that holds its rows (heldAccounts: a rebuild's,
// which has the rebuild's lock) moves its checkpoint when it writes them.
func applySlot(ctx context.Context, pool *pgxpool.Pool, s *slot, events []*Event, hook Hook) error {
	end := events[len(events)-1].Position
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("projections: %s: begin: %w", s.proj.Name(), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// A read model can be rebuilt from the events: losing its last batches in a
	// database crash loses their checkpoint with them, and they are applied again.
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
		return fmt.Errorf("projections: %s: %w", s.proj.Name(), err)
	}
	if s.held == nil { // held rows move their checkpoint when released
		if err := Checkpoints.advance(ctx, tx, s, end, len(events)); err != nil {
			return err
		}
	}
	s.spoiled = true
	if err := s.apply(ctx, tx, events); err != nil {
		return err
	}
	release := s.held.pastBound()
	if release {
		if err := s.release(ctx, tx, end, len(events)); err != nil {
			return err
		}
	}
	if hook != nil {
		if err := hook(ctx, tx); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("projections: %s: commit: %w", s.proj.Name(), err)
	}
	s.pos = end
	s.events += int64(len(events))
	s.spoiled = false
	if release {
		s.held = nil
	}
	return nil
}

// apply applies events to the slot's generation in tx: into its held rows
// if it holds them, else with its memo if it has one and its projection can
// use it.
func (s *slot) apply(ctx context.Context, tx pgx.Tx, events []*Event) error {
	if s.held != nil {
		return accountsProjection{}.applyHeld(ctx, tx, s.gen, events, s.held)
	}
	if m, ok := s.proj.(memoApplier); ok && s.memo != nil {
		return m.applyWith(ctx, tx, s.gen, events, s.memo)
	}
	return s.proj.Apply(ctx, tx, s.gen, events)
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
