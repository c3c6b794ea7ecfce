package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// A full audit resumed from its stop point (Options.Resume; stop.go stores
// it) folds on from the stop position to the head and runs the end-of-audit
// checks whole, so that its report is a run through's (docs/design.md, "A
// full audit stopped and resumed"): the fold's state from the stop point
// (every account's row, what carry carries and carriedStop), the sets of the
// stopped run re-attached (its schema, under its lock), and the snapshot
// checks the fold had not reached. It refuses (start over) a stop point
// edited since, of another build or another store, whose sets were emptied,
// or when a live read model's checkpoint is before the stop position (the
// rows the fold expected there are not kept). Ending, it drops the stop
// point and its sets.

// ErrNoStopPoint means --resume found no stop point.
var ErrNoStopPoint = errors.New("audit: --resume: no stop point is stored (a stopped full audit stores one)")

// ErrStartOver means the stop point cannot be resumed: the audit must be run
// again from the start (without Resume).
var ErrStartOver = errors.New("start over: run the audit without --resume")

// errSetsNotItsOwn marks a stop point no audit can resume: its sets do not
// hold the rows it counted (emptied by a crash, or grown by a resume of it
// that went on past it and ended without a stop point of its own). Found
// under its run's lock, the stop point and its sets are dropped, as nothing
// else would drop them (a plain audit keeps the schema a stop point names).
var errSetsNotItsOwn = errors.New("its sets are not the ones it counted")

// resumeFold loads the stop point, re-attaches its run's sets to f and
// restores f from it; it returns the stop point and the snapshots its audit
// listed. The stop point is read again once its run's lock is held (a
// resume stopped again meanwhile replaces it), and what it is checked
// against is what it holds then.
func resumeFold(ctx context.Context, store Store, opts Options, f *Fold) (*projections.AuditStop, int, error) {
	first, err := loadStop(ctx, opts)
	if err != nil {
		return nil, 0, err
	}
	ps, err := attachRunSets(ctx, opts.Sets, first.Sets)
	if err != nil {
		return nil, 0, err
	}
	f.sets = ps
	stop, err := loadStop(ctx, opts)
	if err == nil && stop.Sets != first.Sets {
		err = fmt.Errorf("audit: --resume: stop point %d was replaced by %d, of other sets, while this resume took its lock: resume again", first.Checkpoint.ID, stop.Checkpoint.ID)
	}
	if err != nil {
		return nil, 0, err
	}
	c, err := decodeCarried(stop.Checkpoint)
	if err == nil && c.Stop == nil {
		err = errors.New("its state carries no stop")
	}
	if err != nil {
		err = fmt.Errorf("%w: %w", err, ErrStartOver)
	} else {
		err = checkStopOptions(c.Stop.Options, foldOptions(f))
	}
	if err == nil {
		err = checkStopIdentity(ctx, store, ps, c.Stop)
	}
	if errors.Is(err, errSetsNotItsOwn) {
		err = dropUnresumable(ctx, opts.Sets, stop, ps, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("audit: --resume: stop point %d: %w", stop.Checkpoint.ID, err)
	}
	ps.copied = c.Stop.SetsRows
	return stop, c.Stop.Snapshots, f.resumeStop(ctx, store, opts.Sets, stop.Checkpoint, c)
}

// loadStop loads the stop point, checked against Options.ExpectDigest.
func loadStop(ctx context.Context, opts Options) (*projections.AuditStop, error) {
	stop, err := projections.Checkpoints.LoadAuditStop(ctx, opts.Sets)
	switch {
	case errors.Is(err, projections.ErrNoAuditStop):
		return nil, ErrNoStopPoint
	case errors.Is(err, projections.ErrAuditStopEdited):
		return nil, fmt.Errorf("audit: --resume: %w: %w", err, ErrStartOver)
	case err != nil:
		return nil, fmt.Errorf("audit: --resume: %w", err)
	case opts.ExpectDigest != "" && stop.Checkpoint.Digest != opts.ExpectDigest:
		return nil, fmt.Errorf("audit: --resume: stop point %d's digest is %s, not the %s expected: it was replaced or edited, digests and all, since: %w",
			stop.Checkpoint.ID, stop.Checkpoint.Digest, opts.ExpectDigest, ErrStartOver)
	}
	return &stop, nil
}

// checkStopOptions refuses a resume whose options (now) change what is
// checked from those of the audit that stored the stop point (stored): the
// events before the stop were checked with those.
func checkStopOptions(stored, now stopOptions) error {
	var differ []string
	if stored.VerifyChain != now.VerifyChain {
		differ = append(differ, fmt.Sprintf("--verify-chain=%v", stored.VerifyChain))
	}
	if stored.NoReadModels != now.NoReadModels {
		differ = append(differ, fmt.Sprintf("--read-models=%v", !stored.NoReadModels))
	}
	if stored.MaxViolations != now.MaxViolations {
		differ = append(differ, fmt.Sprintf("--max-violations=%d", stored.MaxViolations))
	}
	if len(differ) > 0 {
		return fmt.Errorf("it was stored by an audit run with %s: resume with the same options, or %w", strings.Join(differ, " "), ErrStartOver)
	}
	return nil
}

// attachRunSets takes a session of pool for the stopped run's sets: its
// lock (refused while another audit holds it) and its schema, first on the
// session's search_path. The sets are kept (keep) until the resume ends.
func attachRunSets(ctx context.Context, pool *pgxpool.Pool, run string) (*pgSets, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: sets: %w", err)
	}
	s := &pgSets{conn: conn, run: run, keep: true, pool: pool}
	var got, exists bool
	err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+runLock+`), EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, run).Scan(&got, &exists)
	switch {
	case err != nil:
	case !got:
		err = fmt.Errorf("audit: --resume: another audit holds the stop point's sets (%s): it is being resumed", run)
	case !exists:
		err = fmt.Errorf("audit: --resume: the stop point's sets (schema %s) are gone: %w", run, ErrStartOver)
	default:
		err = s.attachRun(ctx)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// checkStopIdentity refuses a stop point of another build, or whose sets are
// of another layout (setsLayout), or whose sets do not
// hold exactly the rows it counted (emptied: an UNLOGGED table is, by a crash
// of PostgreSQL; more: a resume of it went on past it), or whose event
// at the stop position the store no longer holds (another store).
func checkStopIdentity(ctx context.Context, store Store, ps *pgSets, st *carriedStop) error {
	if b := buildID(); st.Build != b {
		return fmt.Errorf("stored by build %q, this is %q: %w", st.Build, b, ErrStartOver)
	}
	if st.SetsLayout != setsLayout {
		return fmt.Errorf("its sets are of another layout (%q, this build's %q): %w", st.SetsLayout, setsLayout, ErrStartOver)
	}
	for i, t := range historyTables {
		var held int64
		table, _, _ := strings.Cut(t, " ")
		if err := ps.conn.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&held); err != nil {
			return fmt.Errorf("its sets: %s: %w", table, err)
		}
		switch {
		case held == 0 && st.SetsRows[i] > 0:
			return fmt.Errorf("its sets were emptied (%s held %d rows; UNLOGGED tables are emptied by a crash of PostgreSQL): %w: %w", table, st.SetsRows[i], errSetsNotItsOwn, ErrStartOver)
		case held != st.SetsRows[i]:
			return fmt.Errorf("its sets are not its own: %s holds %d rows, the stop point counted %d (a resume of it went on past it, killed or stopped again): %w: %w", table, held, st.SetsRows[i], errSetsNotItsOwn, ErrStartOver)
		}
	}
	sr, ok := store.(eventstore.StreamReader)
	if !ok {
		return errors.New("the store reads no streams, to check the event at the stop position")
	}
	recs, err := sr.ReadStream(ctx, st.StopEvent.Stream, st.StopEvent.From, eventstore.Forwards, 1)
	if err = ignoreNotFound(err); err != nil {
		return fmt.Errorf("the event at the stop position: %w", err)
	}
	if len(recs) == 0 || recs[0].ID.String() != st.StopID || recs[0].Revision != st.StopEvent.From {
		return fmt.Errorf("the store does not hold its event at the stop position (%s@%d, ID %s): another store, or one rewritten since: %w",
			st.StopEvent.Stream, st.StopEvent.From, st.StopID, ErrStartOver)
	}
	return nil
}

// resumeStop restores the fold from the stop point's state c and every one
// of its account rows.
func (f *Fold) resumeStop(ctx context.Context, store Store, q projections.Querier, cp projections.AuditCheckpoint, c carried) error {
	st := c.Stop
	f.restoreCounts(c)
	f.lastStream, f.lastRevision, f.lastID = st.StopEvent.Stream, st.StopEvent.From, st.StopID
	for i := range c.Flows {
		t := c.Flows[i]
		f.flows[t.Currency] = &t
	}
	for _, s := range st.BadStreams {
		f.badStream[s] = true
	}
	if err := f.resumeStreams(c.Streams); err != nil {
		return fmt.Errorf("audit: --resume: stop point %d: %w", cp.ID, err)
	}
	f.resumeSagas(c)
	if err := f.resumeAllAccounts(ctx, q, cp); err != nil {
		return err
	}
	if err := f.resumeRecords(ctx, store, c.Records); err != nil {
		return err
	}
	f.Violations, f.violations = st.Violations, st.ViolationCount
	f.batchElements, f.snapshotHoldsUnchecked = st.BatchElements, st.HoldsUnchecked
	f.snapshots = map[string]snapshotCheck{}
	for _, sn := range st.Pending {
		f.snapshots[sn.Stream] = snapshotCheck{revision: sn.Revision, late: sn.Late}
	}
	return nil
}

// resumeAllAccounts reads every account row of the stop point into the
// fold, with the snapshot each records as checked.
func (f *Fold) resumeAllAccounts(ctx context.Context, q projections.Querier, cp projections.AuditCheckpoint) error {
	var n int64
	err := projections.Checkpoints.AllAuditAccounts(ctx, q, cp.ID, func(row projections.AuditAccount) error {
		stream := domain.AccountStream(row.AccountID)
		a, ss, err := rowAccount(stream, row)
		if err != nil {
			return err
		}
		f.Accounts[a.ID], f.streams[stream] = a, ss
		if row.Checked.Recorded() {
			f.recordChecked(stream, row.Checked)
		}
		n++
		return nil
	})
	if err == nil && n != cp.Accounts {
		err = fmt.Errorf("%d account rows read, %d stored", n, cp.Accounts)
	}
	if err != nil {
		return fmt.Errorf("audit: --resume: stop point %d: accounts: %w: %w", cp.ID, err, ErrStartOver)
	}
	return nil
}

// checkResumable refuses a resume when a live read model's checkpoint is
// before the stop position: the fold passed it before it stopped, and the
// rows it expected there are not kept. One at the stop position is compared
// as in a run through (foldExpecting takes its rows before the next event).
func checkResumable(stop *projections.AuditStop, lives []liveGen) error {
	for _, l := range lives {
		if l.pos.Compare(stop.Checkpoint.Position) < 0 {
			return fmt.Errorf("audit: --resume: read model %s (generation %d) is at %s, before the stop point's position %s: the rows the fold expected there are not kept; resume once its projector has passed the stop point, or %w",
				l.name, l.gen, l.pos, stop.Checkpoint.Position, ErrStartOver)
		}
	}
	return nil
}

// dropUnresumable drops stop, which no audit can resume (why), and, as ps
// closes, its sets; ps holds its run's lock.
func dropUnresumable(ctx context.Context, pool *pgxpool.Pool, stop *projections.AuditStop, ps *pgSets, why error) error {
	if _, err := projections.Checkpoints.DropAuditStop(ctx, pool, stop.Checkpoint.ID); err != nil {
		return fmt.Errorf("%w (dropping it: %w)", why, err)
	}
	ps.keep = false
	return fmt.Errorf("%w; it and its sets (schema %s) are dropped", why, stop.Sets)
}

// endResume drops the stop point it resumed from (not one another audit
// stored since in its place) and, with the sets' session closing, its
// sets: the resumed audit ran through.
func endResume(ctx context.Context, pool *pgxpool.Pool, stop *projections.AuditStop, ps *pgSets) error {
	if _, err := projections.Checkpoints.DropAuditStop(ctx, pool, stop.Checkpoint.ID); err != nil {
		return err
	}
	ps.keep = false
	return nil
}

// stopRef names a stop point.
func stopRef(stop *projections.AuditStop) *StopRef {
	cp := stop.Checkpoint
	return &StopRef{ID: cp.ID, Position: cp.Position.String(), Events: cp.Events, Digest: cp.Digest}
}
