package projections

import (
	"context"
	"errors"
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
	return copyOrUpsert(ctx, tx, heldAccountsCopy(gen, rows, ids), func() error { return writeAccounts(ctx, tx, gen, rows) })
}

// heldAccountsCopy is the COPY of rows, each opening its account, to
// generation gen's accounts, in the order of ids.
func heldAccountsCopy(gen int, rows map[string]*accountRow, ids []string) genRows {
	return genRows{base: "accounts", gen: gen, columns: accountColumns, n: len(ids), row: func(c *pgcopy.Buf, i int) error {
		a := rows[ids[i]] // opened: open set its metadata ({} when none)
		status := BalanceState{Status: a.status}.rowStatus()
		c.Text(a.id).Text(a.currency).Int8(a.overdraft).JSONB([]byte(a.metadata)).Text(status).Int8(a.balance).Int8(a.held).Int8(a.revision).Timestamptz(a.openedAt).Timestamptz(a.updatedAt)
		return nil
	}}
}

// holdCmdAccounts makes the commands builder of a generation it created
// empty hold its command_accounts rows in its memo, which holds every
// account's fold while it is complete, rather than upsert the folds a batch
// changed (one row per account a batch touches: BENCHMARKS.md, "Issue 23,
// rbcmd"). Its checkpoint moves each batch with its commands rows, so the
// generation's command_accounts stays empty while its checkpoint moves on:
// the rows are written once, by COPY (writeMemoCmdAccounts), at the end of
// the load, when the rebuild is stopped, or in the batch whose folds pass the
// memo's bound (upserted a batch at a time from then on). A stopped build
// whose rows were not written (a crash, a batch that failed after its fold)
// has an empty command_accounts at a checkpoint past the start: the next
// rebuild builds it afresh (cmdAccountsWritten).
func holdCmdAccounts(s *slot) {
	if s.proj.Name() == Commands && s.pos == eventstore.Start && s.memo != nil && s.memo.complete {
		s.memo.unwritten = true
	}
}

// holding reports whether the memo holds its generation's command_accounts
// rows unwritten (holdCmdAccounts).
func (am *accountMemo) holding() bool { return am != nil && am.unwritten }

// holds reports whether a slot's builder holds rows it has not written.
func (s *slot) holds() bool { return s.held != nil || s.memo.holding() }

// releaseHere writes the rows a slot's builder holds at its checkpoint, in
// tx, and returns how many; the caller drops the hold once tx commits
// (released).
func (s *slot) releaseHere(ctx context.Context, tx pgx.Tx) (int, error) {
	if s.held != nil {
		return len(s.held.rows), s.release(ctx, tx, s.pos, 0)
	}
	// The commands' checkpoint is where the rows are: moved to where it is,
	// it is compared and locked.
	if err := Checkpoints.advance(ctx, tx, s, s.pos, 0); err != nil {
		return 0, err
	}
	return len(s.memo.m), writeMemoCmdAccounts(ctx, tx, s.gen, s.memo)
}

// released drops the hold of a slot whose rows were written.
func (s *slot) released() {
	s.held = nil
	if s.memo != nil {
		s.memo.unwritten = false
	}
}

// cmdAccountsWritten reports whether a stopped build of generation gen of
// proj at pos can be resumed as to its held rows: not the commands'
// generation past the start with an empty command_accounts, whose folds were
// held and not written (holdCmdAccounts; one whose events had no account
// event is built afresh too, harmlessly).
func cmdAccountsWritten(ctx context.Context, q RowQuerier, proj string, gen int, pos eventstore.Position) (bool, error) {
	if proj != Commands || pos == eventstore.Start {
		return true, nil
	}
	var any bool
	if err := q.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s)`, Table("command_accounts", gen))).Scan(&any); err != nil {
		return false, fmt.Errorf("projections: command_accounts of generation %d: %w", gen, err)
	}
	return any, nil
}

// releaseHeld writes the rows the slots' builders hold (slot.releaseHere),
// each in a transaction of its own at the slot's position, hook (when set)
// before its commit. A write that fails does not stop the others' (each
// agrees with its own checkpoint, written or not: review r492): a stop
// resumes every generation whose rows were written.
func releaseHeld(ctx context.Context, pool *pgxpool.Pool, slots []*slot, hook Hook, logger *slog.Logger) error {
	var errs []error
	for _, s := range slots {
		if !s.holds() {
			continue
		}
		start, n := time.Now(), 0
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			if n, err = s.releaseHere(ctx, tx); err != nil || hook == nil {
				return err
			}
			return hook(ctx, tx)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("projections: rebuild: %s's held rows: %w", s.proj.Name(), err))
			continue
		}
		s.released()
		logger.Info("rebuild: held rows written", "projection", s.proj.Name(), "generation", s.gen, "rows", n, "position", s.pos.String(), "took", time.Since(start).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// releaseHeldOnStop releases the held rows of a rebuild stopped in its load,
// best effort and within 30 seconds, so that the next rebuild resumes them
// at their position; those it cannot release it leaves: the next rebuild
// resumes the accounts from where they started, and builds the commands
// afresh (cmdAccountsWritten). A slot whose last batch was folded and did
// not commit (spoiled) holds rows ahead of its checkpoint: not written.
func releaseHeldOnStop(ctx context.Context, pool *pgxpool.Pool, slots []*slot, hook Hook, logger *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var clean []*slot
	for _, s := range slots {
		if s.holds() && s.spoiled {
			logger.Warn("rebuild: held rows not written: a batch folded into them did not commit", "projection", s.proj.Name(), "generation", s.gen, "position", s.pos.String())
			continue
		}
		clean = append(clean, s)
	}
	if err := releaseHeld(rctx, pool, clean, hook, logger); err != nil {
		logger.Warn("rebuild: held rows not written for the projections the error names: the next rebuild resumes the accounts from their start, builds the commands afresh, and resumes a projection whose rows were written at its checkpoint", "error", err)
	}
}
