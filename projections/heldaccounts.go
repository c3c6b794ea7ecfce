package projections

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// heldAccounts are the accounts' rows a rebuild's accounts builder holds in
// memory from the start of "all", rather than upsert each account's row once
// a batch it touches (about as many upserts as a third of the events over
// 100,000 accounts: BENCHMARKS.md, "Issue 23, upserts"). It writes them once,
// with one COPY, and moves its checkpoint from where the rows started to
// where they are in the same transaction (release): at the end of the load,
// when the rebuild is stopped, or when they pass the memo's bound
// (memoAccountsLimit), after which the builder upserts a batch at a time as
// before. Until then its generation's accounts table holds none of them and
// its checkpoint stays where they started: a build stopped without releasing
// them (a crash, a batch that failed after they were folded) resumes the
// accounts from there, so its rows and checkpoint always agree. The holds
// are written a batch at a time as before (their upserts are guarded by
// revision: applied again from the held checkpoint, they change nothing).
type heldAccounts struct {
	rows map[string]*accountRow
	// from and events are the generation's checkpoint as stored: where the
	// rows start, and the events it counts there.
	from   eventstore.Position
	events int64
	// spoiled: a batch was folded into rows and not committed; they are
	// ahead of every checkpoint and are not written.
	spoiled bool
}

// holdAccounts returns the held rows of a slot's builder when it can hold
// them: the accounts projection's generation at the start of "all", which
// has no account rows (only a release writes them, with its checkpoint);
// nil otherwise.
func holdAccounts(s *slot) *heldAccounts {
	if s.proj.Name() != Accounts || s.pos != eventstore.Start {
		return nil
	}
	return &heldAccounts{rows: map[string]*accountRow{}, from: s.pos, events: s.events}
}

// folding marks the rows spoiled until the batch about to be folded into
// them commits (committed).
func (h *heldAccounts) folding() {
	if h != nil {
		h.spoiled = true
	}
}

// committed records that the batch folded into the rows committed.
func (h *heldAccounts) committed() {
	if h != nil {
		h.spoiled = false
	}
}

// pastBound reports whether the held rows are more than the memo's bound:
// the builder releases them and upserts from then on.
func (h *heldAccounts) pastBound() bool {
	return h != nil && len(h.rows) > memoAccountsLimit
}

// release writes the rows a slot's builder holds to its generation and moves
// its checkpoint from where they started to to, counting the events it has
// consumed (s.events) and n more, in tx. The caller drops s.held once tx
// commits.
func (s *slot) release(ctx context.Context, tx pgx.Tx, to eventstore.Position, n int) error {
	h := s.held
	stored := &slot{proj: s.proj, gen: s.gen, pos: h.from}
	if err := Checkpoints.advance(ctx, tx, stored, to, int(s.events+int64(n)-h.events)); err != nil {
		return err
	}
	if err := writeHeldAccounts(ctx, tx, s.gen, h.rows); err != nil {
		return fmt.Errorf("projections: accounts: %w", err)
	}
	return nil
}

// writeHeldAccounts writes rows folded from the start of "all" to generation
// gen: those that opened their account by COPY (the table has none of them),
// as writeAccounts would insert them; should one be there all the same, or a
// row not open its account, writeAccounts writes them all.
func writeHeldAccounts(ctx context.Context, tx pgx.Tx, gen int, rows map[string]*accountRow) error {
	ids := make([]string, 0, len(rows))
	for id, a := range rows {
		if !a.opened {
			return writeAccounts(ctx, tx, gen, rows)
		}
		ids = append(ids, id)
	}
	sort.Strings(ids) // the key's insertions in its order
	cols := []string{"account_id", "currency", "overdraft_limit", "metadata", "status", "balance", "held", "revision", "opened_at", "updated_at"}
	return copyOrUpsert(ctx, tx, genRows{base: "accounts", gen: gen, columns: cols, n: len(ids), row: func(c *pgcopy.Buf, i int) error {
		a := rows[ids[i]] // opened: open set its metadata ({} when none)
		status := BalanceState{Status: a.status}.rowStatus()
		c.Text(a.id).Text(a.currency).Int8(a.overdraft).JSONB([]byte(a.metadata)).Text(status).Int8(a.balance).Int8(a.held).Int8(a.revision).Timestamptz(a.openedAt).Timestamptz(a.updatedAt)
		return nil
	}}, func() error { return writeAccounts(ctx, tx, gen, rows) })
}

// releaseHeld releases the rows the slots' builders hold (slot.release), each
// in a transaction of its own at the slot's position.
func releaseHeld(ctx context.Context, pool *pgxpool.Pool, slots []*slot, logger *slog.Logger) error {
	for _, s := range slots {
		if s.held == nil {
			continue
		}
		start, n := time.Now(), len(s.held.rows)
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return s.release(ctx, tx, s.pos, 0) }); err != nil {
			return fmt.Errorf("projections: rebuild: %w", err)
		}
		s.held = nil
		logger.Info("rebuild: held rows written", "projection", s.proj.Name(), "generation", s.gen, "rows", n, "position", s.pos.String(), "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// releaseHeldOnStop releases the held rows of a rebuild stopped in its load,
// best effort and within 30 seconds, so that the next rebuild resumes them
// at their position; those it cannot release it leaves: the next rebuild
// resumes the accounts from where they started.
func releaseHeldOnStop(ctx context.Context, pool *pgxpool.Pool, slots []*slot, logger *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, s := range slots {
		if s.held != nil && s.held.spoiled {
			logger.Warn("rebuild: held rows not written: a batch folded into them did not commit", "projection", s.proj.Name(), "generation", s.gen, "from", s.held.from.String())
			s.held = nil
		}
	}
	if err := releaseHeld(rctx, pool, slots, logger); err != nil {
		logger.Warn("rebuild: held rows not written; the next rebuild resumes them from their start", "error", err)
	}
}
