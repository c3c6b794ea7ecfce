package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// A full audit stopped (its context cancelled: SIGINT, SIGTERM) at a page's
// end stores a stop point (docs/design.md, "A full audit stopped and
// resumed"): the fold's state as a checkpoint carries it (carried, a row per
// account), with what a full audit's resume needs beside it (carriedStop),
// and the schema of its run's sets, which it then keeps (pgSets.keep). Only a
// full audit of the whole ledger (not --from, not --account) whose sets are
// its run's (not the TEMP fallback) stores one.

// ErrStopped means the audit was stopped (its context ended; the error
// wraps the context's too). Its report,
// when not nil, names the stop point it stored (Report.Stop).
var ErrStopped = errors.New("audit: stopped")

// StopRef names a stored stop point (Report.Stop): `ledger audit --resume`
// folds on from it; Digest anchors it as a checkpoint's digest does
// (Options.ExpectDigest).
type StopRef struct {
	ID       int64  `json:"id"`
	Position string `json:"position"`
	Events   int64  `json:"events"`
	Digest   string `json:"digest"`
}

// carriedStop is what a full audit's resume needs beside carried (read from
// fold.go: what carry does not carry).
type carriedStop struct {
	// Build is the build that stored it; StopEvent the event at its
	// position (the store's identity): another's is started over.
	Build     string        `json:"build"`
	StopEvent carriedRecord `json:"stop_event"` // Count unused
	StopID    string        `json:"stop_event_id"`
	// The violations found so far and their count.
	Violations     []Violation `json:"violations"`
	ViolationCount int         `json:"violation_count"`
	// BatchElements, BadStreams: Fold.batchElements and Fold.badStream.
	BatchElements map[string]string `json:"batch_elements,omitempty"`
	BadStreams    []string          `json:"bad_streams,omitempty"`
	// Snapshots is how many snapshots the audit listed; Pending those the
	// fold had not reached yet, each checked when it does (the others are
	// recorded in the account rows, or named among the violations).
	Snapshots      int               `json:"snapshots"`
	Pending        []carriedSnapshot `json:"pending_snapshots,omitempty"`
	HoldsUnchecked int               `json:"snapshot_holds_unchecked,omitempty"`
	// SetsRows counts the rows of each history table (historyTables);
	// SetsLayout names their definitions (setsLayout): sets of another
	// layout (another build's, an earlier one's: none) are not read.
	SetsRows   [5]int64 `json:"sets_rows"`
	SetsLayout string   `json:"sets_layout"`
	// Options are the options that change what the audit checks: a resume
	// with others is refused (checkStopOptions).
	Options stopOptions `json:"options"`
}

// stopOptions are a fold's options that change what it checks
// (Fold.VerifyChain, Fold.NoRows, Fold.MaxViolations), as a stop point
// stores them.
type stopOptions struct {
	VerifyChain   bool `json:"verify_chain"`
	NoReadModels  bool `json:"no_read_models"`
	MaxViolations int  `json:"max_violations"`
}

// foldOptions are f's options that change what it checks.
func foldOptions(f *Fold) stopOptions {
	return stopOptions{VerifyChain: f.VerifyChain, NoReadModels: f.NoRows, MaxViolations: f.MaxViolations}
}

type carriedSnapshot struct {
	Stream   string `json:"stream"`
	Revision uint64 `json:"revision"`
	Late     bool   `json:"late,omitempty"`
}

// stopSaveTimeout bounds storing a stop point once the audit is stopped.
const stopSaveTimeout = 5 * time.Minute

// stopGrace bounds how long a stop lets the page it landed in finish its
// reads (snapshots read again, streams reloaded, refunded originals, the
// holds read model, a resumed fold's account rows): past it they are
// cancelled, the page does not end, and no stop point is stored.
const stopGrace = time.Minute

// pageReads is the context of the fold's reads inside a page: a stop (ctx
// ended) cancels them only stopGrace later, so that the page it landed in
// ends and the stop point stands at that end (foldUntil stops there), as it
// would had the stop landed between two pages. end releases it.
func pageReads(ctx context.Context) (reads context.Context, end func()) {
	reads, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-reads.Done():
			return
		}
		grace := time.NewTimer(stopGrace)
		defer grace.Stop()
		select {
		case <-grace.C:
			cancel(fmt.Errorf("audit: the page the stop landed in did not end within %s: %w", stopGrace, context.Cause(ctx)))
		case <-reads.Done():
		}
	}()
	return reads, func() { cancel(nil) }
}

// canStop reports whether a run stopped with err may store a stop point.
func (r *auditRun) canStop(ctx context.Context, err error) bool {
	ps, ok := r.f.sets.(*pgSets)
	return ctx.Err() != nil && errors.Is(err, ctx.Err()) && ok && ps.run != "" && r.f.pageEnd &&
		r.f.reloadErr == nil && r.f.Events > 0 && r.opts.From == nil && r.opts.Account == ""
}

// saveStop stores the stopped run's stop point, under a context the stop
// does not cancel (bounded), and returns a report naming it with ErrStopped.
func (r *auditRun) saveStop(ctx context.Context) (*Report, error) {
	stopped := fmt.Errorf("%w (%w)", ErrStopped, ctx.Err())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopSaveTimeout)
	defer cancel()
	ps := r.f.sets.(*pgSets)
	// The last page's COPY, not cancelled with the fold, and the rows held
	// out of the sets (heldrows.go), which a resume reads from them.
	if err := ps.loadHeld(ctx); err != nil {
		return nil, fmt.Errorf("%w; its stop point not stored: the last page's sets: %w", stopped, err)
	}
	f := r.f
	c := f.carriedState()
	c.Stop = &carriedStop{Build: buildID(), SetsLayout: setsLayout, StopEvent: carriedRecord{Stream: f.lastStream, From: f.lastRevision}, StopID: f.lastID,
		Violations: f.Violations, ViolationCount: f.violations, BatchElements: f.batchElements, Snapshots: r.snapshots,
		HoldsUnchecked: f.snapshotHoldsUnchecked, SetsRows: ps.copied, Options: foldOptions(f), BadStreams: slices.Sorted(maps.Keys(f.badStream))}
	for _, s := range slices.Sorted(maps.Keys(f.snapshots)) {
		c.Stop.Pending = append(c.Stop.Pending, carriedSnapshot{Stream: s, Revision: f.snapshots[s].revision, Late: f.snapshots[s].late})
	}
	state, err := encodeCarried(c)
	if err != nil {
		return nil, err
	}
	save := projections.AuditSave{Checkpoint: projections.AuditCheckpoint{Position: f.Last, Events: f.Events, State: state}, Next: f.accountRowsOut(), Rows: f.accountRows()}
	stop, replaced, err := projections.Checkpoints.SaveAuditStop(ctx, r.opts.Sets, save, ps.run)
	if err != nil {
		return nil, fmt.Errorf("%w; its stop point not stored: %w", stopped, err)
	}
	ps.keep = true
	if replaced != "" && replaced != ps.run {
		ps.dropReplaced(ctx, replaced, r.opts.logger())
	}
	return &Report{Stop: stopRef(&stop)}, stopped
}

// buildID names the build: its module version and VCS revision.
func buildID() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	id := bi.Main.Version
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			id += " " + s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			id += " modified"
		}
	}
	return id
}

// noteLast notes the last event of a page folded: where a stop point stands.
func (f *Fold) noteLast(re eventstore.RecordedEvent) {
	f.lastStream, f.lastRevision, f.lastID = re.Stream, re.Revision, re.ID.String()
}

// dropReplaced drops the sets of the stop point a stop replaced, under their
// run's lock: while a resume of it holds the lock, they are its and left
// (that resume drops them as it ends; else the next full audit does).
func (s *pgSets) dropReplaced(ctx context.Context, run string, log *slog.Logger) {
	dropped, err := s.dropOrphanRun(ctx, run)
	switch {
	case err != nil:
		log.Warn("audit: the sets of the stop point replaced could not be dropped: the next full audit drops them", "schema", run, "err", err)
	case !dropped:
		log.Info("audit: the sets of the stop point replaced are held by a running resume: left to it", "schema", run)
	}
}

// ErrNoSuchStop means DropStop found no stop point of the ID given (none
// stored, for ID 0).
var ErrNoSuchStop = errors.New("audit: no such stop point")

// ErrStopRunning means DropStop found the stop point's run held: an audit
// runs it (a resume of it, or the audit that stored it, still ending).
var ErrStopRunning = errors.New("audit: the stop point's run is running")

// DropStop drops stop point id (0: the one stored, whatever its ID) with its
// account rows and its run's sets (its schema), in one transaction under its
// run's lock (runLock), as a resume that ends does; it returns the ID
// dropped and the schema. It refuses (ErrStopRunning) while an audit holds
// the run, and (ErrNoSuchStop) a stop point not stored or replaced meanwhile;
// refused or failing, it has dropped nothing.
func DropStop(ctx context.Context, pool *pgxpool.Pool, id int64) (int64, string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("audit: drop stop point: %w", err)
	}
	defer conn.Release()
	asked := id
	id, run, err := projections.Checkpoints.AuditStopOf(ctx, conn, id)
	if errors.Is(err, projections.ErrNoAuditStop) {
		return 0, "", noSuchStop(asked)
	}
	var got bool
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+runLock+`)`, run).Scan(&got)
	}
	if err != nil {
		return 0, "", fmt.Errorf("audit: drop stop point: %w", err)
	}
	if !got {
		return 0, "", fmt.Errorf("%w: stop point %d: an audit holds its sets (schema %s): a resume of it (or the audit that stored it, still ending); let it end", ErrStopRunning, id, run)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+runLock+`)`, run)
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{}, func(tx pgx.Tx) error {
		sets, err := projections.Checkpoints.DropAuditStop(ctx, tx, id)
		if err == nil && sets != run { // replaced (deleted) since it was read
			return noSuchStop(id)
		}
		if err == nil {
			_, err = tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{run}.Sanitize()+` CASCADE`)
		}
		return err
	})
	if errors.Is(err, ErrNoSuchStop) {
		return 0, "", err
	}
	if err != nil {
		return 0, "", fmt.Errorf("audit: drop stop point %d: %w", id, err)
	}
	return id, run, nil
}

// noSuchStop is ErrNoSuchStop for the ID asked (0: the one stored).
func noSuchStop(asked int64) error {
	if asked == 0 {
		return fmt.Errorf("%w: none is stored (a stopped full audit stores one)", ErrNoSuchStop)
	}
	return fmt.Errorf("%w: %d is not stored (a stopped full audit prints its stop point's ID; there is one at a time)", ErrNoSuchStop, asked)
}
