package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// An incremental audit's comparisons after its fold are statements, one
// after another in the audit's read-model snapshot, and PostgreSQL executes
// them on one core while the audit waits. Those of invariant 9 (the balances
// by effective time of the accounts it read, effectiveMismatches, and of the
// others, untouchedMismatches: four statements, two of them over every
// account) depend on the fold alone, not on the other comparisons, and change
// nothing of it: sideReads runs them on a connection of its own in the same
// snapshot (pg_export_snapshot), in turn, while the comparisons go on in the
// audit's transaction, so that PostgreSQL executes both on the machine's two
// cores. What each finds is reported where the comparisons reach it
// (sideReads.report), so the report is the one the audit made in turn. A
// full audit's comparisons have their tables' digests read while its fold
// runs instead (actuals.go).

// sideRead is one statement of sideReads: what it found once done.
type sideRead struct {
	run      func(ctx context.Context, q pgx.Tx) ([]effectiveFound, int, error)
	done     chan struct{}
	found    []effectiveFound
	unlisted int // found past the limit (untouchedMismatches)
	err      error
}

// sideReads are the statements run beside the comparisons, by name.
type sideReads struct {
	reads  map[string]*sideRead
	cancel context.CancelFunc
	ended  chan struct{}
}

// sideName names the statement of read model l's check (what: "effective"
// or "untouched").
func sideName(what string, l liveGen) string { return what + "/" + l.name }

// startSideReads starts, for an incremental audit of the whole ledger, the
// statements of invariant 9 of each read model compared by effective time
// (nil otherwise: the comparisons make them in turn).
func (r *auditRun) startSideReads(ctx context.Context, expected []expectation) (*sideReads, error) {
	f := r.f
	if f.resumed == nil || r.opts.Account != "" || r.tx == nil {
		return nil, nil
	}
	s := &sideReads{reads: map[string]*sideRead{}, ended: make(chan struct{})}
	var order []*sideRead
	add := func(name string, run func(context.Context, pgx.Tx) ([]effectiveFound, int, error)) {
		sr := &sideRead{run: run, done: make(chan struct{})}
		s.reads[name], order = sr, append(order, sr)
	}
	touched := f.resumedKeys("accounts")
	for i, l := range r.lives {
		if want := expected[i].balances; want != nil && !expected[i].behind {
			add(sideName("effective", l), func(ctx context.Context, q pgx.Tx) ([]effectiveFound, int, error) {
				found, err := f.effectiveMismatches(ctx, q, l, "", want)
				return found, 0, err
			})
			add(sideName("untouched", l), func(ctx context.Context, q pgx.Tx) ([]effectiveFound, int, error) {
				return untouchedMismatches(ctx, q, l, touched, f.MaxViolations)
			})
		}
	}
	if len(order) == 0 {
		return nil, nil
	}
	var snapshot string
	if err := r.tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return nil, fmt.Errorf("audit: read models: %w", err)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.ended)
		s.run(ctx, r, snapshot, order)
	}()
	return s, nil
}

// run makes the statements in order in a transaction of the snapshot's, on
// a connection it closes when done; a failure is each remaining one's.
func (s *sideReads) run(ctx context.Context, r *auditRun, snapshot string, order []*sideRead) {
	tx, closeConn, err := snapshotTx(ctx, r, snapshot)
	if err == nil {
		defer closeConn()
	}
	for _, sr := range order {
		if err == nil {
			sr.found, sr.unlisted, err = sr.run(ctx, tx)
		}
		sr.err = err
		close(sr.done)
	}
}

// snapshotTx is a read-only transaction of the snapshot exported by the
// audit's, on a connection of its own (shortReads), and what closes it.
func snapshotTx(ctx context.Context, r *auditRun, snapshot string) (pgx.Tx, func(), error) {
	conn, err := shortReads(ctx, r.opts.ReadModels)
	if err != nil {
		return nil, nil, err
	}
	closeConn := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err == nil {
		_, err = tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+snapshot+`'`)
	}
	if err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("audit: read models: %w", err)
	}
	return tx, closeConn, nil
}

// report waits for the statement name and reports what it found; false when
// there is no such statement (s nil: none run beside).
func (s *sideReads) report(f *Fold, l liveGen, what string) (bool, error) {
	if s == nil {
		return false, nil
	}
	sr := s.reads[sideName(what, l)]
	if sr == nil {
		return false, nil
	}
	<-sr.done
	if sr.err != nil {
		return true, sr.err
	}
	f.reportEffective(l, sr.found, sr.unlisted)
	return true, nil
}

// stop ends the statements not yet made and waits for their connection to
// close.
func (s *sideReads) stop() {
	if s == nil {
		return
	}
	s.cancel()
	<-s.ended
}
