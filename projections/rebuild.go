package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
)

// Verification names a generation to check before it goes live: its tables must
// equal a fold of the event store up to Position.
type Verification struct {
	Projection string
	Generation int
	Position   eventstore.Position
}

// RebuildOptions configure Rebuild. Zero values take the defaults.
type RebuildOptions struct {
	// Projections names the projections to rebuild (default: all of Names).
	Projections []string
	// BatchSize bounds the events per transaction (default 5000).
	BatchSize int
	// Check checks the built generations before the switch (internal/app/audit's
	// VerifyGeneration), beside the build: it is handed every batch the build
	// reads, and its Verify verdict refuses its generation, which is dropped;
	// a check that could not be done drops none. Nil skips the check: only
	// tests that check otherwise should do that.
	Check Check
	// Progress, when set, is called after each batch with the events this
	// rebuild has consumed (done) and those before where it started reading
	// (carried: a resumed build's, at its checkpoint).
	Progress func(done, carried int64)
	// Hook, when set, runs in every build batch's transaction before its
	// commit, and in each write of held rows (releaseHeld).
	Hook Hook
	// AfterBatch, when set, is called after each committed build batch (tests use
	// it to write, or tamper, while the build runs).
	AfterBatch func(ctx context.Context, gens map[string]int) error
	// Fresh drops the generations a stopped rebuild left and builds anew;
	// otherwise a rebuild resumes each such generation of a projection it
	// rebuilds from that generation's own checkpoint.
	Fresh bool
	// LockTimeout bounds how long the switch waits for readers and the live
	// runner to release the tables (default 30s).
	LockTimeout time.Duration
	// IndexMemoryMiB is the maintenance_work_mem, in MiB, of each session
	// that builds a loaded generation's indexes after the load (0, the
	// default: the server's own setting): the memory of each index's sort, beyond which
	// it spills to temporary files (a parallel build's workers share it).
	// Each projection's indexes are built one after another on a session
	// of its own, every projection's at once, so the index builds hold at
	// most len(Names) times it in PostgreSQL at once.
	IndexMemoryMiB int
	Logger         *slog.Logger
}

// A Check checks the generations a rebuild builds against the event store. The
// store is read once for both: the rebuild hands the check each batch it
// reads, before writing it, so that the check's own work (a fold of the
// events, internal/app/audit) runs beside the build's writes.
type Check interface {
	// Begin starts the check of a build that applies the events after from
	// (eventstore.Start for a new build; a resumed build's check reads the
	// events up to from itself).
	Begin(ctx context.Context, from eventstore.Position) error
	// Fold hands the check the build's next batch, in the order of "all"
	// (which the build does not change). It may return before the check has
	// used the batch, and returns the check's error once it has one.
	Fold(events []*Event) error
	// Verify checks each built generation, all at once, after the last batch:
	// one verdict per verification (nil: it matches the event store; an
	// error: it differs), or an error alone when it could not check them (its
	// context ended, a read failed), which is no verdict on any.
	Verify(ctx context.Context, vs []Verification) (verdicts []error, err error)
	// End releases what Begin took, whether or not Verify ran.
	End()
}

// RebuildResult describes one projection's rebuild.
type RebuildResult struct {
	Projection string
	Previous   int // the generation dropped
	Generation int // the generation now live
	Events     int64
	Position   eventstore.Position
	Duration   time.Duration
}

// ErrRebuildRunning means another rebuild holds the rebuild lock.
var ErrRebuildRunning = errors.New("projections: another rebuild is running")

// MaxIndexMemoryMiB is RebuildOptions.IndexMemoryMiB's bound (docs/design.md,
// "A rebuild"): far below PostgreSQL's own (2 TiB), so that kB or bytes given
// as MiB are refused before anything is built, not by the first index build
// after the load. Its default, 0, leaves the server's setting: 256 MiB made
// the rebuild 1.10x slower at 10,000,000 events on 2 cores (BENCHMARKS.md,
// the lead's quiet runs of 2026-11-29 14:53).
const MaxIndexMemoryMiB = 65536

// ErrIndexMemory: RebuildOptions.IndexMemoryMiB is out of its bounds.
var ErrIndexMemory = fmt.Errorf("projections: rebuild: the index memory must be 0 (the server's setting) to %d MiB", MaxIndexMemoryMiB)

// rebuildLockID is the session advisory lock held for the length of a rebuild.
const rebuildLockID int64 = 0x6c6564676572 // "ledger"

// Rebuild builds a new generation of each named projection from the start of
// "all", beside the live one (readers and the live runner go on), checks it with
// opts.Check, and then switches to it in one transaction: the switch locks the
// live checkpoint (so the live runner pauses), applies whatever the live runner
// applied meanwhile, makes the new generation's checkpoint live, points the views
// at its tables and drops the old generation. A generation that fails its
// index build or the check is dropped and the live one is left as it was, the
// other projections switching; the next rebuild builds it afresh. Stopped
// (ctx ended) before a generation's switch, or unable to check, it keeps the
// generations it has not refused, each at its checkpoint, for the next
// rebuild to resume (docs/design.md, "A rebuild").
func Rebuild(ctx context.Context, pool *pgxpool.Pool, store Store, opts RebuildOptions) ([]RebuildResult, error) {
	if opts.IndexMemoryMiB < 0 || opts.IndexMemoryMiB > MaxIndexMemoryMiB {
		return nil, fmt.Errorf("%w: %d", ErrIndexMemory, opts.IndexMemoryMiB)
	}
	opts.defaults()
	projs, err := Select(opts.Projections)
	if err != nil {
		return nil, err
	}
	unlock, err := lockRebuild(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer unlock()

	resumed, err := resumableBuilds(ctx, pool, projs, opts.Fresh, opts.Logger)
	if err != nil {
		return nil, err
	}
	r := &rebuildRun{pool: pool, store: store, opts: opts, start: time.Now()}
	slots, err := r.createGenerations(ctx, projs, resumed)
	if err != nil {
		return nil, err
	}
	if opts.Check != nil {
		if err := opts.Check.Begin(ctx, minPos(slots)); err != nil {
			if ctx.Err() != nil {
				return nil, r.stopped(ctx, err) // the generations stay, to resume
			}
			dropBuilds(ctx, pool, slots)
			return nil, fmt.Errorf("projections: rebuild: check: %w", err)
		}
		defer opts.Check.End()
	}
	if err := r.buildGenerations(ctx, slots); err != nil {
		if ctx.Err() != nil {
			releaseHeldOnStop(ctx, pool, slots, opts.Hook, opts.Logger)
			return nil, r.stopped(ctx, err)
		}
		dropBuilds(ctx, pool, slots)
		return nil, err
	}
	if err := releaseHeld(ctx, pool, slots, opts.Hook, opts.Logger); err != nil {
		if ctx.Err() != nil {
			releaseHeldOnStop(ctx, pool, slots, opts.Hook, opts.Logger) // as a stop during the load does
			return nil, r.stopped(ctx, err)
		}
		dropBuilds(ctx, pool, slots)
		return nil, err
	}
	forgetMemos(slots, opts.Logger)
	return r.verifyAndSwitch(ctx, slots)
}

// rebuildRun is what the steps of one Rebuild share.
type rebuildRun struct {
	pool  *pgxpool.Pool
	store Store
	opts  RebuildOptions
	start time.Time
}

// stopped returns the error of a rebuild whose context ended before its
// switch, whatever err its step returned: its generations stay, each at its
// checkpoint, for the next rebuild to resume.
func (r *rebuildRun) stopped(ctx context.Context, err error) error {
	r.opts.Logger.Warn("rebuild: stopped; run it again to resume", "error", err)
	return fmt.Errorf("projections: rebuild stopped (%w); its generations are kept: run it again to resume them", context.Cause(ctx))
}

// defaults fills in the zero values of RebuildOptions.
func (o *RebuildOptions) defaults() {
	if len(o.Projections) == 0 {
		o.Projections = Names
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 5000
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// lockRebuild takes the rebuild's session advisory lock on a connection of its
// own; the function it returns releases the lock and the connection.
// ErrRebuildRunning means another rebuild holds it.
func lockRebuild(ctx context.Context, pool *pgxpool.Pool) (unlock func(), err error) {
	lock, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("projections: rebuild: %w", err)
	}
	var got bool
	if err := lock.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, rebuildLockID).Scan(&got); err != nil {
		lock.Release()
		return nil, fmt.Errorf("projections: rebuild lock: %w", err)
	}
	if !got {
		lock.Release()
		return nil, ErrRebuildRunning
	}
	return func() {
		lock.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, rebuildLockID)
		lock.Release()
	}, nil
}

// resumableBuilds returns, by projection, the generation a stopped rebuild
// left being built for each of projs, at its checkpoint; it drops every
// other generation being built of projs (all of them when fresh), and one
// whose held rows were not written (cmdAccountsWritten), which is built
// afresh. Call it only while holding the rebuild lock.
func resumableBuilds(ctx context.Context, pool *pgxpool.Pool, projs []Projection, fresh bool, logger *slog.Logger) (map[string]*slot, error) {
	builds, err := Checkpoints.buildings(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("projections: stale builds: %w", err)
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].gen > builds[j].gen }) // the latest first
	resumed := map[string]*slot{}
	for _, b := range builds {
		p, err := ByName(b.name)
		if err != nil || !slices.ContainsFunc(projs, func(q Projection) bool { return q.Name() == b.name }) {
			continue // not rebuilt now: a later rebuild of it resumes or drops it
		}
		if !fresh && resumed[b.name] == nil {
			s, err := Checkpoints.load(ctx, pool, p, stateBuilding, b.gen)
			if err != nil {
				return nil, err
			}
			ok, err := cmdAccountsWritten(ctx, pool, b.name, b.gen, s.pos)
			if err != nil {
				return nil, err
			}
			if ok {
				resumed[b.name] = s
				continue
			}
			logger.Warn("rebuild: not resumable, built afresh: its held rows were not written", "projection", b.name, "generation", b.gen, "position", s.pos.String())
		}
		if err := dropGeneration(ctx, pool, b.name, b.gen); err != nil {
			return nil, err
		}
	}
	return resumed, nil
}

// createGenerations creates a new generation of each projection, one slot each
// at the start of "all", but for a projection in resumed, whose generation
// goes on from its checkpoint. On failure the generations created are dropped.
func (r *rebuildRun) createGenerations(ctx context.Context, projs []Projection, resumed map[string]*slot) ([]*slot, error) {
	pool, logger := r.pool, r.opts.Logger
	slots := make([]*slot, 0, len(projs))
	var created []*slot
	for _, p := range projs {
		if s := resumed[p.Name()]; s != nil {
			s.memo = newAccountMemo(false) // its rows so far are read back once
			s.memo.indexMemMiB = r.opts.IndexMemoryMiB
			s.held = holdAccounts(s)
			slots = append(slots, s)
			logger.Info("rebuild: resuming", "projection", p.Name(), "generation", s.gen, "position", s.pos.String(), "events", s.events)
			continue
		}
		gen, err := createGeneration(ctx, pool, p.Name())
		if err != nil {
			dropBuilds(ctx, pool, created)
			return nil, err
		}
		s := &slot{proj: p, gen: gen, memo: newAccountMemo(true)}
		s.memo.indexMemMiB = r.opts.IndexMemoryMiB
		s.held = holdAccounts(s)
		holdCmdAccounts(s)
		created = append(created, s)
		slots = append(slots, s)
		logger.Info("rebuild: building", "projection", p.Name(), "generation", gen)
	}
	return slots, nil
}

// forgetMemos lets the builders' memos go once the load is done: the check
// and the switch's catch-up read none (their 100,000 accounts were 43 MB of
// the live heap at the rebuild's peak, in its check). It logs what those
// its projections use held, and for the balance history whether its key was built during the
// load (a read-back: a resumed build, or a memo past its bound) or is left
// to be built after it (migration 00031).
func forgetMemos(slots []*slot, logger *slog.Logger) {
	for _, s := range slots {
		if _, uses := s.proj.(memoApplier); uses && s.memo != nil {
			attrs := []any{"projection", s.proj.Name(), "generation", s.gen, "memo_accounts", len(s.memo.m), "memo_complete", s.memo.complete}
			if s.proj.Name() == Balances {
				attrs = append(attrs, "key_built_in_load", s.memo.keyed)
			}
			logger.Info("rebuild: loaded", attrs...)
		}
		s.memo = nil
	}
}

// generations maps each slot's projection to its generation.
func generations(slots []*slot) map[string]int {
	gens := make(map[string]int, len(slots))
	for _, s := range slots {
		gens[s.proj.Name()] = s.gen
	}
	return gens
}

// buildGenerations applies "all" to the new generations, batch by batch, until
// they have caught up with what "all" shows now, reading each batch ahead while
// the previous one is written. The caller drops the generations on failure.
func (r *rebuildRun) buildGenerations(ctx context.Context, slots []*slot) error {
	pool, store, opts, gens := r.pool, r.store, r.opts, generations(slots)
	var (
		consumed int64
		carried  = carriedEvents(slots)
		ahead    *prefetched
	)
	defer func() {
		if ahead != nil {
			<-ahead.done
		}
	}()
	for {
		events, err := nextBuildBatch(ctx, store, ahead, minPos(slots), opts.BatchSize)
		ahead = nil
		if err == nil && len(events) == opts.BatchSize {
			ahead = startPrefetch(ctx, store, events[len(events)-1].Position, opts.BatchSize)
		}
		if err == nil && len(events) > 0 && opts.Check != nil {
			err = opts.Check.Fold(events)
		}
		if err == nil && len(events) > 0 {
			err = applyBatch(ctx, pool, slots, events, opts.Hook)
		}
		if err != nil {
			return fmt.Errorf("projections: rebuild: %w", err)
		}
		if len(events) > 0 {
			consumed += int64(len(events))
			if err := afterBuildBatch(ctx, opts, consumed, carried, gens); err != nil {
				return err
			}
		}
		if len(events) < opts.BatchSize {
			return nil
		}
	}
}

// carriedEvents is the events before where the build starts reading (minPos):
// those the slot standing there consumed before (0 at the start).
func carriedEvents(slots []*slot) int64 {
	from := minPos(slots)
	for _, s := range slots {
		if s.pos == from {
			return s.events
		}
	}
	return 0
}

// nextBuildBatch returns the batch after from: the one read ahead when it
// starts there, else one read now.
func nextBuildBatch(ctx context.Context, store Store, ahead *prefetched, from eventstore.Position, n int) ([]*Event, error) {
	if ahead != nil {
		<-ahead.done
		if ahead.from == from {
			return ahead.events, ahead.err
		}
	}
	return readBatch(ctx, store, from, n)
}

// afterBuildBatch reports the events consumed so far to opts.Progress and runs
// opts.AfterBatch.
func afterBuildBatch(ctx context.Context, opts RebuildOptions, consumed, carried int64, gens map[string]int) error {
	if opts.Progress != nil {
		opts.Progress(consumed, carried)
	}
	if opts.AfterBatch != nil {
		return opts.AfterBatch(ctx, gens)
	}
	return nil
}

// verifyAndSwitch checks each built generation with opts.Check and switches to
// it; a generation that fails its index build, the check or the switch is
// dropped, and its error joins the others while the remaining projections go
// on. Stopped (ctx ended) or unable to check, it drops none that it has not
// refused and returns that error: the next rebuild resumes them.
func (r *rebuildRun) verifyAndSwitch(ctx context.Context, slots []*slot) ([]RebuildResult, error) {
	pool, opts := r.pool, r.opts
	var results []RebuildResult
	var errs []error
	refusals, err := r.indexAndVerify(ctx, slots)
	if err != nil {
		return nil, err
	}
	var verified []*slot
	for i, s := range slots {
		if err := refusals[i]; err != nil {
			dropBuilds(ctx, pool, []*slot{s})
			errs = append(errs, err)
			continue
		}
		verified = append(verified, s)
	}
	for _, s := range verified {
		prev, err := r.switchGeneration(ctx, s)
		if err != nil && ctx.Err() != nil {
			// A switch whose commit landed all the same made it live:
			// the next rebuild resumes only those still being built.
			errs = append(errs, r.stopped(ctx, err))
			break
		}
		if err != nil {
			dropBuilds(ctx, pool, []*slot{s})
			errs = append(errs, err)
			continue
		}
		opts.Logger.Info("rebuild: switched", "projection", s.proj.Name(), "generation", s.gen, "previous", prev, "position", s.pos.String())
		results = append(results, RebuildResult{Projection: s.proj.Name(), Previous: prev, Generation: s.gen, Events: s.events, Position: s.pos, Duration: time.Since(r.start)})
	}
	return results, errors.Join(errs...)
}

// indexAndVerify builds the loaded generations' indexes (createIndexes) while
// opts.Check verifies them, and returns one refusal per slot (nil: switch
// it). A generation is refused when its indexes fail to build (a unique one
// on a row loaded twice, migrations 00019 and 00031) or the check finds it differs from
// the store; both verdicts are kept. The check reads every row of each table
// and needs none of the indexes; the two overlap, the index builds being
// PostgreSQL's work and the check's mostly the fold's. Stopped (ctx ended),
// whatever the index builds and the check returned, or when the check could
// not be done, it returns that error alone: no verdict, the generations left
// for a rebuild to resume.
func (r *rebuildRun) indexAndVerify(ctx context.Context, slots []*slot) ([]error, error) {
	indexed := make(chan []error, 1)
	go func() { indexed <- createIndexes(ctx, r.pool, slots, r.opts.IndexMemoryMiB, r.opts.Logger) }()
	verdicts := make([]error, len(slots))
	var checkErr error
	if r.opts.Check != nil {
		vs := make([]Verification, len(slots))
		for i, s := range slots {
			vs[i] = Verification{Projection: s.proj.Name(), Generation: s.gen, Position: s.pos}
		}
		start := time.Now()
		verdicts, checkErr = r.opts.Check.Verify(ctx, vs)
		// The check beside the index builds: the tail's longest part at
		// 3,000,000 and 10,000,000 events (BENCHMARKS.md, "rbtail").
		if checkErr == nil {
			r.opts.Logger.Info("rebuild: check done", "generations", len(vs), "took", time.Since(start).Round(time.Millisecond))
		}
		if checkErr == nil && len(verdicts) != len(slots) {
			checkErr = fmt.Errorf("%d verdicts for %d generations", len(verdicts), len(slots))
		}
	}
	indexErrs := <-indexed
	if ctx.Err() != nil {
		return nil, r.stopped(ctx, errors.Join(append(indexErrs, checkErr)...))
	}
	if checkErr != nil {
		return nil, fmt.Errorf("projections: rebuild: could not check the generations (%w); they are kept: run the rebuild again to resume them", checkErr)
	}
	if err := noVerdict(indexErrs); err != nil {
		return nil, fmt.Errorf("projections: rebuild: %w; the generations are kept: run the rebuild again to resume them", err)
	}
	refusals := make([]error, len(slots))
	for i, s := range slots {
		var errs []error
		if err := indexErrs[i]; err != nil {
			errs = append(errs, fmt.Errorf("projections: rebuild of %s refused: %w; generation %d dropped: run the rebuild again to build it afresh", s.proj.Name(), err, s.gen))
		}
		if err := verdicts[i]; err != nil {
			errs = append(errs, fmt.Errorf("projections: rebuild of %s refused: generation %d does not match the event store: %w", s.proj.Name(), s.gen, err))
		}
		refusals[i] = errors.Join(errs...)
	}
	return refusals, nil
}

// errNoVerdict marks the error of a step after the load that says nothing of
// the generation's rows (its vacuum: a lost connection, a cancel, a statement
// timeout): the generation is kept for a resume, not dropped as a refusal,
// whose load a statement timeout would otherwise throw away on every attempt.
var errNoVerdict = errors.New("not a verdict on the generation's rows")

// noVerdict joins the errors of errs that are no verdict (errNoVerdict).
func noVerdict(errs []error) error {
	var out []error
	for _, err := range errs {
		if errors.Is(err, errNoVerdict) {
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

// createIndexes builds the indexes of the loaded generations that their load
// did without (migrations 00009, 00019 and 00031: the secondary ones, and the unique
// ones no write of the load needs), one projection's on a connection each at
// once, after vacuuming its tables: one pass over the rows each, rather than
// one insertion per row during the load. It returns each slot's error (nil:
// built).
func createIndexes(ctx context.Context, pool *pgxpool.Pool, slots []*slot, memMiB int, logger *slog.Logger) []error {
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if err := vacuumGeneration(ctx, pool, s.proj.Name(), s.gen); err != nil {
				errs[i] = fmt.Errorf("vacuum of %s generation %d: %w (%w)", s.proj.Name(), s.gen, err, errNoVerdict)
				return
			}
			logger.Info("rebuild: vacuumed", "projection", s.proj.Name(), "generation", s.gen, "took", time.Since(start).Round(time.Millisecond))
			start = time.Now()
			if err := buildIndexes(ctx, pool, s.proj.Name(), s.gen, memMiB); err != nil {
				errs[i] = fmt.Errorf("indexes of %s generation %d: %w", s.proj.Name(), s.gen, err)
				return
			}
			logger.Info("rebuild: indexes built", "projection", s.proj.Name(), "generation", s.gen, "took", time.Since(start).Round(time.Millisecond), "memory_mib", memMiB)
		}()
	}
	wg.Wait()
	return errs
}

// buildIndexes builds a loaded generation's indexes in one transaction whose
// maintenance_work_mem is memMiB: the memory of each index's sort, which
// PostgreSQL's default (64 MB) makes spill to temporary files at the size of
// a rebuild (docs/design.md, "A rebuild").
func buildIndexes(ctx context.Context, pool *pgxpool.Pool, name string, gen, memMiB int) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := setIndexMemory(ctx, tx, memMiB); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT readmodel.create_secondary_indexes($1, $2)`, name, gen)
		return err
	})
}

// setIndexMemory gives tx's index builds memMiB of maintenance_work_mem
// (RebuildOptions.IndexMemoryMiB); 0 leaves the session's.
func setIndexMemory(ctx context.Context, tx pgx.Tx, memMiB int) error {
	if memMiB <= 0 {
		return nil
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL maintenance_work_mem = '%dMB'`, memMiB))
	return err
}

// vacuumGeneration vacuums and freezes the tables of a loaded generation, which
// its load left unvacuumed (autovacuum off, migration 00025: docs/design.md, "A
// rebuild"), before their indexes are built: no index to clean yet, and the
// generation goes live with its visibility map set and nothing left for
// autovacuum. VACUUM cannot run in a transaction: one statement, on a
// connection of its own; a resumed rebuild repeats it harmlessly.
func vacuumGeneration(ctx context.Context, pool *pgxpool.Pool, name string, gen int) error {
	rows, err := pool.Query(ctx, `SELECT readmodel.generation_tables($1, $2)`, name, gen)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(tables) == 0 {
		return fmt.Errorf("generation %d of %s has no tables", gen, name)
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = pgx.Identifier{"readmodel", t}.Sanitize()
	}
	_, err = pool.Exec(ctx, `VACUUM (FREEZE) `+strings.Join(names, ", "))
	return err
}

// createGeneration creates the tables and the building checkpoint of a new
// generation of a projection.
func createGeneration(ctx context.Context, pool *pgxpool.Pool, name string) (int, error) {
	var gen int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT nextval('readmodel.generation_seq')::int`).Scan(&gen); err != nil {
			return err
		}
		// Its secondary indexes, and the unique ones its load does not need,
		// are built after the load (createIndexes).
		if _, err := tx.Exec(ctx, `SELECT readmodel.create_generation($1, $2), readmodel.drop_secondary_indexes($1, $2)`, name, gen); err != nil {
			return err
		}
		return Checkpoints.createBuilding(ctx, tx, name, gen)
	})
	if err != nil {
		return 0, fmt.Errorf("projections: create generation of %s: %w", name, err)
	}
	return gen, nil
}

// dropGeneration drops a generation that is being built, never a live one (a
// switch whose commit was acknowledged late may have made it live after all).
func dropGeneration(ctx context.Context, pool *pgxpool.Pool, name string, gen int) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		dropped, err := Checkpoints.dropBuilding(ctx, tx, name, gen)
		if err != nil || !dropped {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT readmodel.drop_generation($1, $2)`, name, gen)
		return err
	})
}

// dropBuilds drops unfinished generations, best effort (a later rebuild drops
// whatever is left).
func dropBuilds(ctx context.Context, pool *pgxpool.Pool, slots []*slot) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, s := range slots {
		_ = dropGeneration(dctx, pool, s.proj.Name(), s.gen)
	}
}

// switchGeneration makes a built generation live in one transaction and drops the
// previous one; it returns the previous generation.
func (r *rebuildRun) switchGeneration(ctx context.Context, s *slot) (int, error) {
	name := s.proj.Name()
	sw := liveSwitch{name: name, gen: s.gen, pos: s.pos}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, r.opts.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		live, err := Checkpoints.lockForSwitch(ctx, tx, name, s.gen, s.pos)
		if err != nil {
			return err
		}
		sw.prev = live.gen
		// Catch up with the live generation, in this transaction.
		if err := r.catchUpInTx(ctx, tx, s, live.pos, &sw); err != nil {
			return err
		}
		return makeLive(ctx, tx, sw)
	})
	if err != nil {
		return 0, fmt.Errorf("projections: switch %s to generation %d: %w", name, s.gen, err)
	}
	s.pos = sw.pos
	s.events += sw.applied
	return sw.prev, nil
}

// catchUpInTx applies to the building generation of s, in tx, the events from
// sw.pos up to the live checkpoint, moving sw.pos and counting them in
// sw.applied.
func (r *rebuildRun) catchUpInTx(ctx context.Context, tx pgx.Tx, s *slot, live eventstore.Position, sw *liveSwitch) error {
	for sw.pos.Compare(live) < 0 {
		recs, err := r.store.ReadAll(ctx, sw.pos, r.opts.BatchSize)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("the store shows nothing after %s, the live checkpoint is %s", sw.pos, live)
		}
		events, err := DecodeAll(recs)
		if err != nil {
			return err
		}
		if err := s.proj.Apply(ctx, tx, s.gen, events); err != nil {
			return err
		}
		sw.pos = recs[len(recs)-1].Position
		sw.applied += int64(len(recs))
	}
	return nil
}

// makeLive drops the checkpoint of generation sw.prev, makes generation
// sw.gen's live at sw.pos, points the views at its tables and drops prev's
// tables.
func makeLive(ctx context.Context, tx pgx.Tx, sw liveSwitch) error {
	if err := Checkpoints.switchLive(ctx, tx, sw); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT readmodel.publish_generation($1, $2)`, sw.name, sw.gen); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT readmodel.drop_generation($1, $2)`, sw.name, sw.prev)
	return err
}
