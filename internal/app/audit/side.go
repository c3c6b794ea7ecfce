package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// An incremental audit's comparisons after its fold are statements, one
// after another in the audit's read-model snapshot, and PostgreSQL executes
// them on one core while the audit waits. Those that depend on the fold
// alone, not on the other comparisons, and change nothing of it run on a
// connection of their own in the same snapshot (pg_export_snapshot), in
// turn (sideReads): the balances by effective time of the accounts it read
// (effectiveMismatches) while the comparisons go on in the audit's
// transaction, so that PostgreSQL executes both on the machine's two cores;
// the statements over every account (untouched.go) while the fold runs.
// What each finds is reported where the comparisons reach it
// (sideReads.wait), so the report is the one the audit made in turn. A full
// audit's comparisons have their tables' digests read while its fold runs
// instead (actuals.go).

// sideRead is one statement of sideReads: what it found once done.
type sideRead struct {
	run   func(ctx context.Context, q pgx.Tx) (any, error)
	done  chan struct{}
	found any
	err   error
}

// sideReads are the statements run beside the audit, by name.
type sideReads struct {
	reads  map[string]*sideRead
	order  []*sideRead
	cancel context.CancelFunc
	ended  chan struct{}
}

// sideName names the statement of read model l's check (what: "effective",
// "untouched", "digest").
func sideName(what string, l liveGen) string { return what + "/" + l.name }

// add adds a statement to make, in the order added.
func (s *sideReads) add(name string, run func(context.Context, pgx.Tx) (any, error)) {
	if s.reads == nil {
		s.reads = map[string]*sideRead{}
	}
	sr := &sideRead{run: run, done: make(chan struct{})}
	s.reads[name], s.order = sr, append(s.order, sr)
}

// startSideReads starts, for an incremental audit of the whole ledger, the
// statements of invariant 9 of the accounts it read, of each read model
// compared by effective time (nil otherwise: the comparisons make them in
// turn).
func (r *auditRun) startSideReads(ctx context.Context, expected []expectation) (*sideReads, error) {
	f := r.f
	if !f.incrementalOfAll(r.opts.Account) || r.tx == nil {
		return nil, nil
	}
	s := &sideReads{}
	for i, l := range r.lives {
		if want := expected[i].balances; want != nil && !expected[i].behind {
			s.add(sideName("effective", l), func(ctx context.Context, q pgx.Tx) (any, error) {
				found, err := f.effectiveMismatches(ctx, q, l, "", want)
				return found, err
			})
		}
	}
	return s, s.start(ctx, r)
}

// start makes s's statements, in order, in a transaction of the audit's
// read-model snapshot on a connection of its own; a failure is each
// remaining one's. With none to make it starts nothing.
func (s *sideReads) start(ctx context.Context, r *auditRun) error {
	if len(s.order) == 0 {
		return nil
	}
	var snapshot string
	if err := r.tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return fmt.Errorf("audit: read models: %w", err)
	}
	s.ended = make(chan struct{})
	ctx, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.ended)
		s.run(ctx, r, snapshot)
	}()
	return nil
}

// run makes the statements in order in a transaction of the snapshot's, on
// a connection it closes when done; a failure is each remaining one's.
func (s *sideReads) run(ctx context.Context, r *auditRun, snapshot string) {
	tx, closeConn, err := snapshotTx(ctx, r, snapshot)
	if err == nil {
		defer closeConn()
	}
	for _, sr := range s.order {
		if err == nil {
			sr.found, err = sr.run(ctx, tx)
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

// wait waits for the statement name and returns what it found; false when
// there is no such statement (s nil, or none started: none run beside).
func (s *sideReads) wait(name string) (any, bool, error) {
	if s == nil || s.ended == nil {
		return nil, false, nil
	}
	sr := s.reads[name]
	if sr == nil {
		return nil, false, nil
	}
	<-sr.done
	return sr.found, true, sr.err
}

// stop ends the statements not yet made and waits for their connection to
// close.
func (s *sideReads) stop() {
	if s == nil || s.ended == nil {
		return
	}
	s.cancel()
	<-s.ended
}
