package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// Store is what an audit reads: "all" and its head.
type Store = projections.Store

// Options configure Run.
type Options struct {
	// Account, when set, limits the per-account checks and the read-model
	// comparison to that account (the fold still reads all of "all": money
	// conservation is a property of the whole ledger).
	Account string
	// VerifyChain recomputes every stream's hash chain (tamper evidence).
	VerifyChain bool
	// ReadModels, when set, is the read-model database: every read model is
	// compared with the fold (invariant 4). Nil checks the event store alone.
	ReadModels *pgxpool.Pool
	// Sets, when set, is a PostgreSQL database whose session keeps, in
	// tables of its own (a full audit's: UNLOGGED, in a schema of its run,
	// runsets.go; else TEMP), what grows with history (every event ID, command group,
	// key and claim, the read models' expected rows), checked there by set
	// queries: the audit's memory then grows with accounts and sagas, not
	// with events. Default: ReadModels; nil there too: Go maps.
	Sets *pgxpool.Pool
	// BatchSize bounds the events read per request (default 5000).
	BatchSize int
	// MaxViolations bounds the violations listed (all are counted; default 1000).
	MaxViolations int
	// Progress, when set, is told after each page the events this run has
	// folded (done) and those before its start that it carries from its
	// checkpoint (carried), which it does not read.
	Progress func(done, carried int64)
	// EventsOut, when set, checks LEDGER_EVENTS against the store (invariant
	// 8, eventsout.go); it needs ReadModels.
	EventsOut *EventsOutOptions
	// From, when set, resumes from a stored audit checkpoint (its ID; 0: the
	// last one) and checks only the events after it (resume.go). It needs
	// Sets or ReadModels, which hold the checkpoints.
	From *int64
	// ExpectDigest, with From, refuses the checkpoint unless its digest
	// (projections.AuditCheckpoint.Digest) is this one: an anchor the
	// operator kept outside the database.
	ExpectDigest string
	// Resume folds on from the stop point a stopped full audit stored
	// (resumestop.go), ExpectDigest, when set, its digest (StopRef.Digest).
	// Not with From or Account; it needs Sets.
	Resume bool
	// SaveCheckpoint stores the audit's result as a checkpoint when it finds
	// no violation (Report.Checkpoint). It needs Sets or ReadModels; not with
	// Account (a checkpoint carries every account).
	SaveCheckpoint bool
	// SnapshotsListedAgain, when set, is called once a checkpointing audit
	// has listed the snapshots again (checkSnapshotsWritten) and before it
	// stores its checkpoint: a test writes there a snapshot in the window
	// the checkpoint does not record (docs/design.md, invariant 7). Nil in
	// production.
	SnapshotsListedAgain func()
	// Logger, when set, is told what the audit does beside its report (its
	// sets not resumable, runs left behind dropped). Default: slog.Default().
	Logger *slog.Logger
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// CheckpointRef names an audit checkpoint.
type CheckpointRef struct {
	ID       int64  `json:"id"`
	Position string `json:"position"`
	Events   int64  `json:"events"` // events folded from the start of "all" up to it
	// Accounts and AccountsRead, of the checkpoint an incremental audit
	// resumed from: its accounts, and those it read (the events touched them).
	Accounts     int64 `json:"accounts,omitempty"`
	AccountsRead int64 `json:"accounts_read,omitempty"`
	// Digest anchors the checkpoint (projections.AuditCheckpoint.Digest):
	// kept outside the database, Options.ExpectDigest checks it.
	Digest string `json:"digest,omitempty"`
	// Trusted, of the checkpoint an incremental audit resumed from: what it
	// does not check again by design (TrustedFromCheckpoint), which a full
	// audit checks.
	Trusted []string `json:"trusted,omitempty"`
	// Parent, of the checkpoint an audit stored: the checkpoint its delta
	// chains to (migration 00030), absent when it stored a root of every
	// account's row (a full audit's, or an incremental audit's compaction:
	// projections.AuditChainMax).
	Parent int64 `json:"parent,omitempty"`
}

// TrustedFromCheckpoint is what an incremental audit trusts of the ledger
// before its checkpoint, by design (docs/design.md, "An incremental audit"):
// a full audit checks all of it.
var TrustedFromCheckpoint = []string{
	"the read models' rows of the events before the checkpoint in the balance history, statement, transfers and commands tables " +
		"(the accounts table and the active holds are compared whole; invariant 9 checks each untouched account's last balance-history row, and that no entry follows it)",
	"the holds table's rows of closed holds that no event after the checkpoint touched: one edited (and still closed), deleted or added " +
		"(the active holds are compared whole), and so a snapshot's copy of such a hold, which is checked against its row",
	"a key decided before the checkpoint and again after it under event IDs of its own, when its claim does not give the revision of its decision " +
		"(a claim without one, or one written before a decision that landed later): not named key_decided_twice",
	"the commands read model's command_accounts row of an account stream never opened that no event after the checkpoint touched " +
		"(the ledger writes none: a command on an unknown account is rejected unrecorded): counted, its values not compared",
}

// ReadModelCheck is one projection's comparison with the fold.
type ReadModelCheck struct {
	Projection string      `json:"projection"`
	Generation int         `json:"generation"`
	Position   string      `json:"checkpoint"`
	Tables     []TableDiff `json:"tables"`
	// NotCompared says why an incremental audit did not compare it.
	NotCompared string `json:"not_compared,omitempty"`
	// Partial says what of it an incremental audit did not compare, and why.
	Partial string `json:"partial,omitempty"`
}

// Report is the outcome of an audit.
type Report struct {
	Head           string           `json:"head"`
	Events         int64            `json:"events"`
	Streams        int              `json:"streams"`
	Accounts       int              `json:"accounts"`
	Transfers      int              `json:"transfers"`
	Keys           int              `json:"keys"`
	Snapshots      int              `json:"snapshots"`                                 // account snapshots checked (invariant 7)
	HoldsUnchecked int              `json:"snapshot_holds_unchecked,omitempty"`        // of those, the snapshots whose closed holds were not checked (no holds read model at or past them)
	SnapsTrusted   int              `json:"snapshots_trusted,omitempty"`               // not counted in Snapshots: an incremental audit's, of revisions its checkpoint passed, stored with the bytes the checkpoint records its audit checked
	SnapsFromStart int              `json:"snapshots_folded_from_start,omitempty"`     // of Snapshots, an incremental audit's of revisions its checkpoint passed that it does not record: folded from their stream's first event
	SnapsWritten   int              `json:"snapshots_written_while_running,omitempty"` // of Snapshots, a checkpointing audit's written while it ran, of revisions its fold passed: listed again before it stored its checkpoint, checked from its base
	Account        string           `json:"account,omitempty"`
	ChainVerified  bool             `json:"chain_verified"`
	Totals         []Totals         `json:"totals"`
	ReadModels     []ReadModelCheck `json:"read_models,omitempty"`
	EventsOut      *EventsOutReport `json:"events_out,omitempty"`
	From           *CheckpointRef   `json:"from,omitempty"`          // the checkpoint an incremental audit resumed from
	Checkpoint     *CheckpointRef   `json:"checkpoint,omitempty"`    // the checkpoint this audit stored
	NoCheckpoint   string           `json:"no_checkpoint,omitempty"` // why a clean audit asked to store one did not
	Stop           *StopRef         `json:"stop_point,omitempty"`    // the stop point a stopped audit stored (with ErrStopped)
	Resumed        *StopRef         `json:"resumed_from,omitempty"`  // the stop point a resumed audit folded on from
	Violations     []Violation      `json:"violations"`
	ViolationCount int              `json:"violation_count"`
}

// OK reports whether no invariant is broken.
func (r *Report) OK() bool { return r.ViolationCount == 0 }

// Has reports whether a violation of the given invariant and kind ("" for any) was found.
func (r *Report) Has(invariant int, kind string) bool {
	for _, v := range r.Violations {
		if v.Invariant == invariant && (kind == "" || v.Kind == kind) {
			return true
		}
	}
	return false
}

// Run audits the ledger: it folds "all" up to the head it sees when it starts,
// checks the invariants, and compares each read model, as of its checkpoint, with
// the fold as of the same position (the tables and checkpoints are read in one
// snapshot).
func Run(ctx context.Context, store Store, opts Options) (*Report, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 5000
	}
	if opts.Sets == nil {
		opts.Sets = opts.ReadModels
	}
	if err := checkpointOptions(opts); err != nil {
		return nil, err
	}
	r := &auditRun{store: store, opts: opts}
	var endReads func()
	r.reads, endReads = pageReads(ctx)
	defer endReads()
	rep, err := r.run(ctx)
	if err != nil { // a checkpoint refused by the check of its chain beside the fold first
		if refused := r.chain.wait(); refused != nil {
			return nil, refused
		}
	}
	return rep, err
}

// run is Run's audit once its options are checked.
func (r *auditRun) run(ctx context.Context) (*Report, error) {
	opts := r.opts
	f, err := r.runFold(ctx)
	if err != nil {
		return nil, err
	}
	defer f.sets.close()
	// The read models' snapshot comes first, so that the store's head is at or
	// after every checkpoint.
	if opts.ReadModels != nil {
		r.tx, err = opts.ReadModels.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, fmt.Errorf("audit: read models: %w", err)
		}
		defer r.tx.Rollback(context.WithoutCancel(ctx))
		if r.lives, err = liveGenerations(ctx, r.tx); err != nil {
			return nil, err
		}
		if r.stop != nil {
			if err := checkResumable(r.stop, r.lives); err != nil {
				return nil, err
			}
		}
		if r.short, err = shortReads(ctx, opts.ReadModels); err != nil {
			return nil, err
		}
		defer r.short.Close(context.WithoutCancel(ctx))
		f.holdsRM = newHoldsReadModel(r.reads, r.short, r.lives)
	}
	if err := r.readHead(ctx); err != nil {
		return nil, err
	}
	r.idsFromStore(ctx)
	stop, err := r.readActuals(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	stopUntouched, err := r.readUntouched(ctx)
	if err != nil {
		return nil, err
	}
	defer stopUntouched()
	expected, err := r.foldExpecting(ctx)
	if err == nil {
		err = r.chain.wait() // the checkpoint's rows are trusted from here on
	}
	if err != nil && r.canStop(ctx, err) {
		return r.saveStop(ctx)
	}
	if err != nil {
		return nil, err
	}
	if err := r.checkSnapshotsWritten(ctx); err != nil {
		return nil, err
	}
	if opts.SnapshotsListedAgain != nil && opts.SaveCheckpoint {
		opts.SnapshotsListedAgain()
	}
	rep, err := r.report(ctx, expected)
	if err == nil && r.stop != nil {
		rep.Resumed = stopRef(r.stop)
		err = endResume(ctx, opts.Sets, r.stop, f.sets.(*pgSets))
	}
	return rep, err
}

// auditRun is what the steps of one Run share.
type auditRun struct {
	store     Store
	opts      Options
	f         *Fold
	stop      *projections.AuditStop // the stop point a resumed audit folds on from
	reads     context.Context        // the fold's reads inside a page (pageReads)
	tx        pgx.Tx                 // the read models' snapshot; nil without them
	short     *pgx.Conn              // the short reads beside it (shortReads)
	lives     []liveGen              // their live generations in that snapshot
	snapshots int                    // the account snapshots the fold checks
	head      eventstore.Position
	// actuals are the read models' hashed tables' digests, read while the
	// fold runs (readActuals); nil when read after it.
	actuals *actuals
	// untouched are an incremental audit's reads over every account, made
	// while the fold runs (readUntouched); nil otherwise.
	untouched *sideReads
	// chain is an incremental audit's check of its checkpoint's chain, run
	// beside the fold (checkChainBeside); nil otherwise.
	chain *chainCheck
	// accountsTable is what the accounts read model's comparison found.
	accountsTable accountsTable
}

// readHead lists the snapshots to check, then reads the head the audit
// folds to: each snapshot was taken of events already stored, so the fold up
// to the head reaches every one.
func (r *auditRun) readHead(ctx context.Context) error {
	f := r.f
	var err error
	if r.stop == nil {
		r.snapshots, err = checkSnapshotsOf(ctx, r.store, f, r.opts.Account)
	}
	if err != nil {
		return err
	}
	// The fold reads the snapshots listed (a resume's: its stop point's) as
	// it reaches them, inside a page.
	snapshotReaders(r.reads, r.store, f)
	if r.head, err = r.store.Head(ctx); err != nil {
		return fmt.Errorf("audit: head: %w", err)
	}
	if r.stop != nil && r.stop.Checkpoint.Position.Compare(r.head) > 0 {
		return fmt.Errorf("audit: --resume: stop point %d is at %s, after the store's head %s: it was made of another store: %w", r.stop.Checkpoint.ID, r.stop.Checkpoint.Position, r.head, ErrStartOver)
	}
	if f.from != nil && f.from.Position.Compare(r.head) > 0 {
		return fmt.Errorf("audit: --from: checkpoint %d is at %s, after the store's head %s: it was made of another store", f.from.ID, f.from.Position, r.head)
	}
	return nil
}

// runFold is the fold Run drives (r.f): its options, its sets in PostgreSQL
// when there is a database for them (f.sets.close drops them), and, with
// --from, the state of the audit checkpoint it resumes from, with --resume,
// the stop point's (r.stop, r.snapshots; resumestop.go).
func (r *auditRun) runFold(ctx context.Context) (*Fold, error) {
	store, opts := r.store, r.opts
	f := NewFold()
	r.f = f
	f.VerifyChain = opts.VerifyChain
	f.NoRows = opts.ReadModels == nil
	if opts.MaxViolations > 0 {
		f.MaxViolations = opts.MaxViolations
	}
	f.Reload = reloader(r.reads, store)
	f.originals = newOriginals(r.reads, store)
	if opts.Resume {
		stop, snapshots, err := resumeFold(ctx, store, opts, f)
		if err != nil {
			if f.sets != nil {
				f.sets.close()
			}
			return nil, err
		}
		r.stop, r.snapshots = stop, snapshots
		return f, nil
	}
	if opts.Sets != nil {
		ps, err := foldSets(ctx, opts)
		if err != nil {
			return nil, err
		}
		f.sets = ps
	}
	if opts.From != nil {
		cp, err := projections.Checkpoints.LoadAuditRow(ctx, opts.Sets, *opts.From)
		if err == nil && opts.ExpectDigest != "" && cp.Digest != opts.ExpectDigest {
			err = fmt.Errorf("audit: --from: checkpoint %d's digest is %s, not the %s expected: it was replaced or edited, digests and all, since; run a full audit", cp.ID, cp.Digest, opts.ExpectDigest)
		} else if err == nil {
			r.chain = checkChainBeside(ctx, opts.Sets, cp)
			err = f.resume(ctx, store, opts.Sets, cp, r.chain)
		} else {
			err = fmt.Errorf("audit: --from: %w", err)
		}
		if err != nil {
			f.sets.close()
			return nil, err
		}
		f.lookupClaim = func(key string) (*claim, error) { return f.claimBefore(ctx, store, key) }
	}
	return f, nil
}

// foldSets takes the fold's sets in opts.Sets: a full audit's in a schema
// of its run (runsets.go), an incremental audit's in its session's TEMP
// tables; either drops the runs left behind (dropOrphanRuns). A full audit
// of the whole ledger holds the rows it compares by their sums out of
// PostgreSQL until read (heldrows.go).
func foldSets(ctx context.Context, opts Options) (*pgSets, error) {
	if opts.From == nil {
		s, err := newRunSets(ctx, opts.Sets, opts.logger())
		if err == nil && opts.Account == "" {
			s.holdIDKeyed()
		}
		return s, err
	}
	s, err := newPGSets(ctx, opts.Sets)
	if err == nil {
		if err = s.dropOrphanRuns(ctx, opts.logger()); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, err
}

// report finishes the fold, compares the read models and writes the report.
func (r *auditRun) report(ctx context.Context, expected []expectation) (*Report, error) {
	f, opts := r.f, r.opts
	var save projections.AuditSave
	if opts.SaveCheckpoint { // what it carries, before Finish adds up the balances
		var err error
		if save.Checkpoint.State, err = f.carry(); err != nil {
			return nil, err
		}
		save.Next = f.accountRowsOut()
		save.Rows = f.accountRows()
		if f.from != nil {
			// A checkpoint whose audit did not check every refunded sum
			// (trustRecorded false) passes none of its records on, neither
			// of the accounts this audit folds (recordResumed) nor of the
			// others.
			save.CarryFrom, save.CarryNoSnapshots = f.from.ID, !f.trustRecorded
		}
	}
	totals, err := f.FinishContext(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := f.sets.keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: keys: %w", err)
	}
	rep := &Report{
		Snapshots: r.snapshots - f.snapshotsTrusted + f.snapshotsWritten, SnapsTrusted: f.snapshotsTrusted, SnapsFromStart: f.snapshotsFromStart, SnapsWritten: f.snapshotsWritten, HoldsUnchecked: f.snapshotHoldsUnchecked, Head: r.head.String(), Events: f.Events, Streams: len(f.streams) + f.settledTransfers + f.settledTx + f.claimed + int(f.accountRows()) - len(f.Accounts), Accounts: int(f.accountRows()),
		Transfers: len(f.Transfers) + f.settledTransfers, Keys: keys, Account: opts.Account, ChainVerified: opts.VerifyChain, Totals: totals,
	}
	err = r.compareReadModels(ctx, rep, expected)
	if serr := r.liveSwitched(ctx); serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, err
	}
	if opts.EventsOut != nil {
		if rep.EventsOut, err = checkEventsOut(ctx, r.store, opts.ReadModels, f, *opts.EventsOut); err != nil {
			return rep, err
		}
	}
	rep.Violations, rep.ViolationCount = f.Violations, f.ViolationCount()
	if opts.Account != "" {
		rep.Violations, rep.ViolationCount = f.forAccount(opts.Account)
	}
	if f.from != nil {
		rep.From = &CheckpointRef{ID: f.from.ID, Position: f.from.Position.String(), Events: f.from.Events, Accounts: f.resumed.rows, AccountsRead: f.resumed.loaded, Digest: f.from.Digest, Trusted: TrustedFromCheckpoint}
	}
	if opts.SaveCheckpoint && rep.OK() {
		if rep.NoCheckpoint = r.notCheckpointable(); rep.NoCheckpoint != "" {
			return rep, nil
		}
		save.Checkpoint.Position, save.Checkpoint.Events, save.Checkpoint.AccountsTable = f.Last, f.Events, r.accountsTable.digest
		save.Checkpoint.ActiveHolds = r.accountsTable.holds
		saved, err := projections.Checkpoints.SaveAudit(ctx, opts.Sets, save)
		if saved.ID != 0 { // stored, even should dropping the oldest have failed
			rep.Checkpoint = &CheckpointRef{ID: saved.ID, Position: f.Last.String(), Events: f.Events, Digest: saved.Digest, Parent: saved.Parent}
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// compareReadModels compares each live read model with the fold as of its
// checkpoint (invariants 4 and 9; the accounts table as a whole too:
// tabledigest.go), adding each comparison to rep.
func (r *auditRun) compareReadModels(ctx context.Context, rep *Report, expected []expectation) error {
	f, opts := r.f, r.opts
	side, err := r.startSideReads(ctx, expected)
	if err != nil {
		return err
	}
	defer side.stop()
	touched := map[string]bool{} // the accounts an incremental audit read, by the end
	for _, id := range f.resumedKeys("accounts") {
		touched[id] = true
	}
	for i, l := range r.lives {
		if expected[i].behind {
			rep.ReadModels = append(rep.ReadModels, ReadModelCheck{Projection: l.name, Generation: l.gen, Position: l.pos.String(),
				NotCompared: "its checkpoint is before the audit checkpoint's"})
			continue
		}
		e := expected[i]
		if l.name == projections.Commands {
			e = r.commandAccountsExpected(e, touched)
		}
		check, err := r.checkReadModel(ctx, l, e)
		if err == nil && l.name == projections.Commands {
			check.Partial, err = r.checkUntouchedCommandAccounts(l, touched)
		}
		if err != nil {
			return err
		}
		if l.name == projections.Accounts && opts.Account == "" {
			if err := r.checkAccountsTables(ctx, l, expected[i]); err != nil {
				return err
			}
		}
		if expected[i].balances != nil {
			if err := r.checkEffective(ctx, side, l, expected[i].balances, touched); err != nil {
				return err
			}
		}
		rep.ReadModels = append(rep.ReadModels, check)
	}
	return nil
}

// checkAccountsTables compares the accounts read model l's two tables
// compared whole (tabledigest.go, holdsdigest.go), with their digests read
// beside the fold when they were (readUntouched).
func (r *auditRun) checkAccountsTables(ctx context.Context, l liveGen, expected expectation) error {
	f := r.f
	whole, err := r.wholeOf("digest", l)
	if err == nil {
		r.accountsTable, err = f.checkAccountsTable(ctx, r.tx, l, expected.accounts, whole)
	}
	if err == nil {
		whole, err = r.wholeOf("holds", l)
	}
	if err == nil {
		r.accountsTable.holds, err = f.checkHoldsTable(ctx, r.tx, l, expected.seq, whole)
	}
	return err
}

// checkEffective checks invariant 9 of read model l: the balances by
// effective time of the fold's accounts, as side made them or, without it,
// in turn, and, in an incremental audit of the whole ledger, of those it did
// not read (those not in touched: the accounts it read by the end, compared
// or not), from what was read beside the fold (readUntouched).
func (r *auditRun) checkEffective(ctx context.Context, side *sideReads, l liveGen, want map[string][2]int64, touched map[string]bool) error {
	f, opts := r.f, r.opts
	found, ok, err := side.wait(sideName("effective", l))
	if ok && err == nil {
		f.reportEffective(l, found.([]effectiveFound), 0)
	} else if !ok {
		err = f.checkEffectiveBalances(ctx, r.tx, l, opts.Account, want)
	}
	if err != nil || !f.incrementalOfAll(opts.Account) {
		return err
	}
	untouched, unlisted, err := r.untouchedOf(l, touched)
	f.reportEffective(l, untouched, unlisted)
	return err
}

// notCheckpointable says why a clean audit stores no checkpoint ("": it
// does): a checkpoint is trusted for every row before it, so every live read
// model must have been compared at the audit's head (one behind it leaves
// rows projected later unchecked, which an audit from the checkpoint would
// never compare), the accounts table's digest among them.
func (r *auditRun) notCheckpointable() string {
	for _, l := range r.lives {
		if l.pos != r.f.Last {
			return fmt.Sprintf("read model %s is at %s, not at the audit's head %s: run the audit again once the projector has caught up", l.name, l.pos, r.f.Last)
		}
	}
	if r.accountsTable.digest == "" {
		return "the accounts read model was not compared (give the read models' database)"
	}
	return ""
}

// checkpointOptions checks what From, Resume and SaveCheckpoint need.
func checkpointOptions(opts Options) error {
	if opts.Resume && (opts.From != nil || opts.Account != "" || opts.Sets == nil) {
		return errors.New("audit: a resume folds on a stopped full audit of the whole ledger: not with From or Account, and with the database of its sets")
	}
	if opts.ExpectDigest != "" && opts.From == nil && !opts.Resume {
		return errors.New("audit: an expected digest is a checkpoint's: give the checkpoint (From)")
	}
	if (opts.From != nil || opts.SaveCheckpoint) && opts.Sets == nil {
		return errors.New("audit: checkpoints are kept in PostgreSQL: give the read models' database")
	}
	if opts.SaveCheckpoint && opts.Account != "" {
		return errors.New("audit: a checkpoint carries every account: not with an audit of one account")
	}
	return incrementalPoolSize(opts)
}

// incrementalPoolSize refuses an incremental audit whose sets' pool cannot
// give the connections it takes at once: its sets' session and its
// read-model snapshot's (when that pool is the same) for the whole run, and
// one more for the reads of its checkpoint's rows beside them (the fold's,
// and the chain's check's, which waits on nothing). With fewer, those reads
// would wait for ever (review r475: pool_max_conns=2 hung).
func incrementalPoolSize(opts Options) error {
	if opts.From == nil || opts.Sets == nil {
		return nil
	}
	need := int32(2)
	if opts.Sets == opts.ReadModels {
		need = 3
	}
	if have := opts.Sets.Config().MaxConns; have < need {
		return fmt.Errorf("audit: an incremental audit (--from) takes %d connections of the read models' pool at once; it allows %d (pool_max_conns): give it %d or more", need, have, need)
	}
	return nil
}

// reloader reads a stream again for the fold (Fold.Reload); nil for a store
// that reads no streams (the fold then keeps every stream).
func reloader(ctx context.Context, store Store) func(string, uint64) ([]eventstore.RecordedEvent, error) {
	sr, ok := store.(eventstore.StreamReader)
	if !ok {
		return nil
	}
	return func(stream string, before uint64) ([]eventstore.RecordedEvent, error) {
		recs, err := sr.ReadStream(ctx, stream, 0, eventstore.Forwards, int(before))
		if err != nil {
			return nil, fmt.Errorf("audit: read %s again: %w", stream, err)
		}
		return recs, nil
	}
}

// expectation is what a read model should hold as of its checkpoint: the
// rows of its tables kept in memory, and the fold's event count then (the
// rows noted in PostgreSQL up to it).
type expectation struct {
	rows map[string]map[string]string
	seq  int64
	// balances: of the balances and entries read models, each account's
	// balance and held amount as of its checkpoint (invariant 9, effective.go).
	balances map[string][2]int64
	// behind: the read model's checkpoint is before an incremental audit's
	// checkpoint, so the fold never stood where it stands: not compared.
	behind bool
	// accounts: in an incremental audit, the accounts the fold had read as of
	// the read model's checkpoint, whose rows of the accounts table it
	// compares (resumedKeys then; one first touched later is not expected).
	accounts []string
}

// foldExpecting folds "all" up to head, taking on the way, for each live
// generation, the rows the fold expects in its tables as of its checkpoint.
func (r *auditRun) foldExpecting(ctx context.Context) ([]expectation, error) {
	f, lives, opts := r.f, r.lives, r.opts
	expected := make([]expectation, len(lives))
	for i, l := range r.lives {
		expected[i].behind = r.behind(l)
	}
	snapshot := func(next *eventstore.Position) {
		for i, l := range r.lives {
			if expected[i].rows == nil && !expected[i].behind && (next == nil || next.Compare(l.pos) > 0) {
				expected[i] = expectation{rows: f.Expected(l.name, opts.Account), seq: f.Events, accounts: f.resumedKeys("accounts")}
				if ps, ok := f.sets.(*pgSets); ok {
					ps.sums.mark(f.Events)
				}
				if l.name == projections.Balances || l.name == projections.Entries {
					expected[i].balances = f.accountBalances(opts.Account)
				}
			}
		}
	}
	if err := foldUntil(ctx, r.store, f, foldTo{until: r.head, batch: opts.BatchSize, before: snapshot, progress: opts.Progress, reads: r.reads}); err != nil {
		return nil, err
	}
	snapshot(nil)
	if f.Last == r.head {
		f.settleAtHead()
	}
	return expected, nil
}

// checkReadModel compares a live generation's tables with the rows the fold
// expected as of its checkpoint (invariant 4); a checkpoint after the fold's
// last event means the read model was built from another store.
func (r *auditRun) checkReadModel(ctx context.Context, l liveGen, expected expectation) (ReadModelCheck, error) {
	f := r.f
	if l.pos.Compare(f.Last) > 0 {
		f.violate(Violation{Invariant: InvReadModel, Kind: "checkpoint_ahead", Message: fmt.Sprintf(
			"read model %s is at %s, after the store's head %s: it was built from another store", l.name, l.pos, f.Last)})
	}
	check := ReadModelCheck{Projection: l.name, Generation: l.gen, Position: l.pos.String()}
	for _, table := range ProjectionTables[l.name] {
		actual, err := r.actuals.of(l.name, table)
		if err != nil {
			return ReadModelCheck{}, err
		}
		d, err := f.compareTable(ctx, tableRead{q: r.tx, table: table, account: r.opts.Account}, expected, actual)
		if err != nil {
			return ReadModelCheck{}, err
		}
		check.Tables = append(check.Tables, d)
		if !d.OK() {
			f.violate(Violation{Invariant: InvReadModel, Kind: "read_model_mismatch", Message: fmt.Sprintf(
				"read model %s (generation %d, at %s) differs from the fold of the event store: %s", l.name, l.gen, l.pos, d.Describe(5))})
		}
	}
	return check, nil
}

// compareTable compares a read-model table (gen 0: the live view) with what
// the fold expected of it: a table whose rows the fold noted in PostgreSQL by
// a join there (actual, when set, the table's digest already read), another
// in memory.
func (f *Fold) compareTable(ctx context.Context, tr tableRead, expected expectation, actual *digester) (TableDiff, error) {
	table := tr.table
	noted := f.from != nil && notedTables[table] // an incremental audit: the rows its events touched
	if ps, ok := f.sets.(*pgSets); ok && notedTables[table] {
		return ps.compare(ctx, tr, expected.seq, noted, actual)
	}
	var keys []string // every row, but in an incremental audit's tables of a row per account
	if table == "accounts" || table == "command_accounts" {
		keys = expected.accounts
	}
	t, err := openTable(ctx, tr, keys)
	if err != nil {
		return TableDiff{}, err
	}
	defer t.Close()
	return compareRows(table, expected.rows[table], t, noted)
}

// forAccount keeps the violations that concern the account, and the global ones.
func (f *Fold) forAccount(account string) ([]Violation, int) {
	var out []Violation
	for _, v := range f.Violations {
		keep := v.Stream == "" || v.Stream == domain.AccountStream(account)
		if id, ok := strings.CutPrefix(v.Stream, domain.TransferStreamPrefix); ok {
			if p, noted := f.parties[id]; noted && (p[0] == account || p[1] == account) {
				keep = true
			} else if t := f.Transfers[id]; t != nil && (t.From == account || t.To == account) {
				keep = true // a violation restored from a stop point: its transfer's accounts were not noted
			}
		}
		if keep {
			out = append(out, v)
		}
	}
	return out, len(out)
}

type liveGen struct {
	name string
	gen  int
	pos  eventstore.Position
}

func liveGenerations(ctx context.Context, q Querier) ([]liveGen, error) {
	live, err := projections.Checkpoints.Live(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	out := make([]liveGen, len(live))
	for i, l := range live {
		out[i] = liveGen{name: l.Name, gen: l.Generation, pos: l.Position}
	}
	return out, nil
}

// shortReads is the connection of the audit's short reads of the read
// models outside its snapshot (the closed holds' check, liveSwitched): its
// own, not one of the pool's, whose sets' session and snapshot tx the audit
// holds for its whole run, so that a pool of two connections
// (pool_max_conns=2) does not leave a third read waiting for ever.
func shortReads(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	c, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("audit: read models: %w", err)
	}
	return c, nil
}

// liveSwitched is an error naming each read model whose live generation is
// no longer the one the audit's read-model snapshot found (nil: none). The
// comparisons read the live views in that snapshot: after a rebuild's
// switch committed mid-audit, a view names the new generation's tables,
// whose rows the snapshot cannot see, and the comparison would report a
// false mismatch (or fail on the dropped tables). A switch can commit only
// before a comparison reads a table, or after the comparison is done with it
// (the comparisons in the audit's transaction hold a table until the audit
// ends; a full audit's reading during the fold, actuals.go, holds its tables
// until it has read them all, in a transaction whose snapshot is the
// audit's): so one read after every comparison sees every switch that could
// have misled one.
func (r *auditRun) liveSwitched(ctx context.Context) error {
	if r.tx == nil {
		return nil
	}
	now, err := liveGenerations(ctx, r.short)
	if err != nil {
		return err
	}
	gens := make(map[string]int, len(now))
	for _, l := range now {
		gens[l.name] = l.gen
	}
	var switched []string
	for _, l := range r.lives {
		if g, ok := gens[l.name]; !ok || g != l.gen {
			switched = append(switched, fmt.Sprintf("%s from generation %d to %d", l.name, l.gen, g))
		}
	}
	if switched == nil {
		return nil
	}
	return fmt.Errorf("audit: a rebuild switched read model %s during the audit, which read the old one's snapshot: its read-model comparison is void; rerun the audit", strings.Join(switched, ", "))
}

// foldTo is how far foldUntil folds, by pages of batch events, and what it
// calls on the way: before with each event's position before the event is
// folded, progress with the events folded so far (either may be nil). reads
// is the context of the reads inside a page (pageReads; nil: foldUntil's).
type foldTo struct {
	until    eventstore.Position
	batch    int
	before   func(*eventstore.Position)
	progress func(done, carried int64)
	reads    context.Context
}

// next is the position the fold reads "all" after: its last event's, or the
// start.
func (f *Fold) next() eventstore.Position {
	if f.Events > 0 {
		return f.Last
	}
	return eventstore.Start
}

// foldUntil folds "all" after the fold's last event up to and including
// position until, storing the fold's sets after each page. before, when set,
// is called with each event's position before the event is folded. The
// pages are read, and their metadata decoded, one page ahead of the fold
// (readAhead), so the store's query, the decoding, the fold and the sets'
// COPY of the page before run at the same time.
func foldUntil(ctx context.Context, store eventstore.AllReader, f *Fold, to foldTo) error {
	until, batch, before, progress, reads := to.until, to.batch, to.before, to.progress, to.reads
	if reads == nil {
		reads = ctx
	}
	from, carried := f.next(), f.Events
	if from.Compare(until) >= 0 {
		return nil
	}
	rctx, cancel := context.WithCancel(ctx) // the reader's: ends it when the fold stops early
	spent := make(chan []meta, pagesInFlight)
	pages := readAhead(rctx, store, from, until, batch, spent)
	defer func() {
		cancel()
		for range pages { // the reader's last page, if it was sending one
		}
	}()
	for p := range pages {
		if err := ctx.Err(); err != nil {
			return err // stopped at the last page's end, the next one (or its read's error) not begun
		}
		if p.err != nil {
			return p.err
		}
		f.pageEnd = false
		if err := f.prefetch(reads, p.recs); err != nil {
			return err
		}
		for i := range p.recs {
			re := &p.recs[i] // not a copy taken by address: one allocation an event
			if before != nil {
				before(&re.Position)
			}
			f.apply(*re, p.metas[i])
		}
		f.Settle()
		if err := cmp.Or(f.reloadErr, f.sets.flush(ctx)); err != nil {
			return err
		}
		select { // folded: the reader decodes a later page into it
		case spent <- p.metas:
		default:
		}
		if n := len(p.recs); n > 0 {
			f.noteLast(p.recs[n-1])
		}
		f.pageEnd = true
		if progress != nil {
			progress(f.Events-carried, carried)
		}
		if err := ctx.Err(); err != nil {
			return err // stopped at a page's end (stop.go)
		}
	}
	return ctx.Err() // the reader stops without a last page when ctx is done
}

// page is a page of "all" with each event's metadata decoded, or why it
// could not be read.
type page struct {
	recs  []eventstore.RecordedEvent
	metas []meta
	err   error
}

// pagesInFlight bounds the pages readAhead's reader and its fold hold at
// once: the one folded, the one in the channel, the one being decoded.
const pagesInFlight = 3

// readAhead reads "all" after from up to and including until, a page of
// batch events at a time, one page ahead of its reader: the channel holds one
// page while the next is read. It closes the channel after the last page, a
// page with an error, or when ctx is done. It decodes a page's metadata into
// a slice its reader sent back on spent once folded when there is one
// (spent holds at most pagesInFlight), else into a new one: a page's
// metadata is about 256 bytes an event, the most the fold allocated of it.
func readAhead(ctx context.Context, store eventstore.AllReader, from, until eventstore.Position, batch int, spent chan []meta) <-chan page {
	pages := make(chan page, 1)
	go func() {
		defer close(pages)
		for from.Compare(until) < 0 {
			recs, err := store.ReadAll(ctx, from, batch)
			if err != nil {
				err = fmt.Errorf("audit: read all after %s: %w", from, err)
			}
			done := err != nil || len(recs) < batch
			if i := cutAfter(recs, until); i < len(recs) {
				recs, done = recs[:i], true
			}
			p := page{recs: recs, metas: reuseMetas(spent, len(recs)), err: err}
			for i, re := range recs {
				p.metas[i] = decodeAll(re)
			}
			select {
			case pages <- p:
			case <-ctx.Done():
				return
			}
			if done {
				return
			}
			from = recs[len(recs)-1].Position
		}
	}()
	return pages
}

// reuseMetas is a slice of n metas: one sent back on spent when there is
// one long enough, else a new one.
func reuseMetas(spent chan []meta, n int) []meta {
	select {
	case m := <-spent:
		if cap(m) >= n {
			return m[:n]
		}
	default:
	}
	return make([]meta, n)
}

// cutAfter returns the number of recs at or before until.
func cutAfter(recs []eventstore.RecordedEvent, until eventstore.Position) int {
	for i, re := range recs {
		if re.Position.Compare(until) > 0 {
			return i
		}
	}
	return len(recs)
}

// ErrGenerationMismatch is returned by VerifyGeneration for a generation that
// does not equal the fold of the event store.
var ErrGenerationMismatch = errors.New("audit: generation differs from the event store")

// VerifyGeneration checks built generations of projections against the fold
// of the event store up to their checkpoints: row counts and a digest of every
// table, with the first differing rows named. It is
// projections.RebuildOptions.Check: one fold, its sets in a session of pool,
// folds the batches the build hands it as the build writes them (a goroutine
// of its own), and serves every generation, in the order of their positions.
func VerifyGeneration(pool *pgxpool.Pool, store Store) projections.Check {
	return &generationCheck{pool: pool, store: store}
}

// generationCheck is VerifyGeneration's check: run folds the batches sent on
// pages (closed, and set to nil, when the build is done); err is run's error,
// read once done is closed.
type generationCheck struct {
	pool   *pgxpool.Pool
	store  Store
	f      *Fold
	ps     *pgSets
	pages  chan []*projections.Event
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

// checkAhead bounds the batches handed to the check and not yet folded.
const checkAhead = 1

func (c *generationCheck) Begin(ctx context.Context, from eventstore.Position) error {
	ps, err := newRowSets(ctx, c.pool)
	if err != nil {
		return err
	}
	c.ps, c.f = ps, NewFold()
	c.f.sets, c.f.Reload = ps, reloader(ctx, c.store)
	ctx, c.cancel = context.WithCancel(ctx)
	c.pages, c.done = make(chan []*projections.Event, checkAhead), make(chan struct{})
	go c.run(ctx, from, c.pages)
	return nil
}

// run folds "all" up to from (a resumed build's events before it), then each
// batch handed to Fold, storing the sets after each.
func (c *generationCheck) run(ctx context.Context, from eventstore.Position, pages <-chan []*projections.Event) {
	defer close(c.done)
	if c.err = foldUntil(ctx, c.store, c.f, foldTo{until: from, batch: 5000}); c.err != nil {
		return
	}
	for events := range pages {
		for _, ev := range events {
			c.f.apply(ev.RecordedEvent, builtMeta(ev))
		}
		c.f.Settle()
		if c.err = cmp.Or(c.f.reloadErr, c.ps.flush(ctx)); c.err != nil {
			return
		}
	}
}

// Fold hands the check the build's batch as it is: the check's goroutine
// folds its events with the metadata and the account events' payloads the
// build decoded (builtMeta). The build and the check only read the events.
func (c *generationCheck) Fold(events []*projections.Event) error {
	select {
	case c.pages <- events:
		return nil
	case <-c.done:
		return cmp.Or(c.err, errors.New("audit: the check has ended"))
	}
}

// builtMeta is an event's meta for the fold from what the build decoded of it
// (the same decoders as the audit's, domain.DecodeMetadataNoRequest and
// domain.DecodeEvent): the metadata and payload of an account, transfer or
// transaction event, which the fold takes as they are rather than decode the
// event again; the events the projections skip (key streams) are decoded
// here, metadata and claim at once (decodeAll).
func builtMeta(ev *projections.Event) meta {
	if !ev.MetaDecoded {
		return decodeAll(ev.RecordedEvent)
	}
	return meta{m: ev.Meta, payload: ev.Payload, payloadErr: ev.DecodeErr, decoded: true}
}

// Verify returns an error alone, no verdict, when it could not check (its
// context ended, a read failed).
func (c *generationCheck) Verify(ctx context.Context, vs []projections.Verification) ([]error, error) {
	errs := make([]error, len(vs))
	if err := c.finishFolding(); err != nil {
		return nil, err
	}
	order := make([]int, len(vs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return vs[order[a]].Position.Compare(vs[order[b]].Position) < 0 })
	for _, i := range order {
		if c.f.Events > 0 && c.f.Last.Compare(vs[i].Position) > 0 {
			errs[i] = fmt.Errorf("audit: generation %d of %s is at %s, before the batches its check was handed (up to %s)", vs[i].Generation, vs[i].Projection, vs[i].Position, c.f.Last)
			continue
		}
		if err := foldUntil(ctx, c.store, c.f, foldTo{until: vs[i].Position, batch: 5000}); err != nil {
			return nil, err
		}
		var err error
		if errs[i], err = verifyOne(ctx, c.pool, c.f, vs[i]); err != nil {
			return nil, err
		}
	}
	return errs, nil
}

// finishFolding waits for run to fold the batches handed to it.
func (c *generationCheck) finishFolding() error {
	if c.pages != nil {
		close(c.pages)
		c.pages = nil
	}
	<-c.done
	return c.err
}

func (c *generationCheck) End() {
	c.cancel()
	_ = c.finishFolding()
	c.ps.close()
}

// verifyOne compares one generation with the fold; the first error is its
// verdict (ErrGenerationMismatch), the second a failure to check.
func verifyOne(ctx context.Context, pool *pgxpool.Pool, f *Fold, v projections.Verification) (error, error) {
	expected := expectation{rows: f.Expected(v.Projection, ""), seq: f.Events}
	var faults []string
	for _, table := range ProjectionTables[v.Projection] {
		d, err := f.compareTable(ctx, tableRead{q: pool, table: table, gen: v.Generation}, expected, nil)
		if err != nil {
			return nil, err
		}
		if !d.OK() {
			faults = append(faults, d.Describe(5))
		}
	}
	if len(faults) == 0 {
		return nil, nil
	}
	for _, vi := range f.Violations { // a broken stream explains a mismatch
		if len(faults) > 10 {
			break
		}
		faults = append(faults, "event store: "+vi.String())
	}
	return fmt.Errorf("%w: %s", ErrGenerationMismatch, strings.Join(faults, "; ")), nil
}

// Write prints the report for people.
func (r *Report) Write(w io.Writer) {
	scope := "the whole ledger"
	if r.Account != "" {
		scope = "account " + r.Account
	}
	fmt.Fprintf(w, "Audit of %s, up to position %s\n", scope, r.Head)
	if r.From != nil {
		fmt.Fprintf(w, "  from audit checkpoint %d at %s (%d events before it, trusted; digest %s): the %d events after it checked; %d of its %d accounts read (those they touched)\n",
			r.From.ID, r.From.Position, r.From.Events, r.From.Digest, r.Events-r.From.Events, r.From.AccountsRead, r.From.Accounts)
		for _, t := range r.From.Trusted {
			fmt.Fprintf(w, "  trusted from the checkpoint, not checked again (a full audit checks it): %s\n", t)
		}
	}
	fmt.Fprintf(w, "  %d events in %d streams: %d accounts, %d transfers, %d client keys\n", r.Events, r.Streams, r.Accounts, r.Transfers, r.Keys)
	chain := "not verified (use --verify-chain)"
	if r.ChainVerified {
		chain = "verified"
	}
	fmt.Fprintf(w, "  hash chains: %s\n", chain)
	fmt.Fprintf(w, "  account snapshots: %d checked against their streams (invariant 7)\n", r.Snapshots)
	if r.SnapsTrusted > 0 {
		fmt.Fprintf(w, "  account snapshots: %d not checked again, recorded by the checkpoint with the same bytes (of revisions it passed)\n", r.SnapsTrusted)
	}
	if r.SnapsFromStart > 0 {
		fmt.Fprintf(w, "  account snapshots: %d of revisions the checkpoint passed, not recorded by it, checked by a fold from their stream's first event\n", r.SnapsFromStart)
	}
	if r.SnapsWritten > 0 {
		fmt.Fprintf(w, "  account snapshots: %d written while the audit ran, of revisions its fold passed, checked from its base before it stored its checkpoint\n", r.SnapsWritten)
	}
	if r.HoldsUnchecked > 0 {
		fmt.Fprintf(w, "  account snapshots: %d whose closed holds were not checked (no holds read model at or past them)\n", r.HoldsUnchecked)
	}
	fmt.Fprintln(w, "Money per currency (invariant 2: balances + in flight = deposits - withdrawals - refunds out + refunds in):")
	for _, t := range r.Totals {
		fmt.Fprintf(w, "  %s  balances %d + in flight %d (%d pending sagas) = %d;  deposits %d - withdrawals %d - refunds out %d + refunds in %d = %d  (%d accounts)\n",
			t.Currency, t.Balances, t.InFlight, t.PendingSaga, t.Balances+t.InFlight,
			t.Deposits, t.Withdrawals, t.RefundsOut, t.RefundsIn, t.Deposits-t.Withdrawals-t.RefundsOut+t.RefundsIn, t.Accounts)
	}
	r.writeReadModels(w)
	if r.EventsOut != nil {
		r.EventsOut.write(w)
	}
	if c := r.Checkpoint; c != nil {
		form := "a root: every account's row"
		if c.Parent != 0 {
			form = fmt.Sprintf("a delta of checkpoint %d: the rows of the accounts this audit read", c.Parent)
		}
		fmt.Fprintf(w, "Audit checkpoint %d stored at %s (%d events; %s): ledger audit --from %d --expect-digest %s checks what comes after\n",
			c.ID, c.Position, c.Events, form, c.ID, c.Digest)
	}
	if r.NoCheckpoint != "" {
		fmt.Fprintf(w, "No audit checkpoint stored: %s\n", r.NoCheckpoint)
	}
	if r.OK() {
		fmt.Fprintln(w, "OK: invariants 1, 2, 3, 5 hold"+map[bool]string{true: ", 4 and 9 hold", false: ", 9's times hold"}[len(r.ReadModels) > 0]+map[bool]string{true: ", 8 holds", false: ""}[r.EventsOut != nil]+map[bool]string{true: ", chains intact", false: ""}[r.ChainVerified])
		return
	}
	fmt.Fprintf(w, "VIOLATIONS: %d\n", r.ViolationCount)
	byInv := append([]Violation(nil), r.Violations...)
	sort.SliceStable(byInv, func(i, j int) bool { return byInv[i].Invariant < byInv[j].Invariant })
	for _, v := range byInv {
		fmt.Fprintf(w, "  %s\n", v)
	}
	if n := r.ViolationCount - len(r.Violations); n > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", n)
	}
}

// writeReadModels prints the comparison of each read model with the fold.
func (r *Report) writeReadModels(w io.Writer) {
	if len(r.ReadModels) == 0 {
		return
	}
	fmt.Fprintln(w, "Read models (invariant 4: each equals a fold of the event store at its checkpoint):")
	for _, c := range r.ReadModels {
		var parts []string
		ok := true
		for _, d := range c.Tables {
			parts = append(parts, fmt.Sprintf("%s %d rows", d.Table, d.Rows))
			ok = ok && d.OK()
		}
		verdict := "ok"
		if !ok {
			verdict = "MISMATCH"
		}
		if c.NotCompared != "" {
			verdict = "not compared: " + c.NotCompared
		}
		if c.Partial != "" {
			verdict += "; not compared: " + c.Partial
		}
		fmt.Fprintf(w, "  %-9s generation %d at %s: %s: %s\n", c.Projection, c.Generation, c.Position, strings.Join(parts, ", "), verdict)
	}
}
