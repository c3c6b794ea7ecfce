package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/projections"
)

// A full audit's sets outlive its session (docs/design.md, "A full audit
// stopped and resumed"): its history tables are UNLOGGED tables of a schema
// of its run, audit_sets_<16 hex> (migration 00028's audit_checkpoints.sets
// checks that form, so a name is never SQL), put first on the session's
// search_path so that pgsets.go's statements find them; compare's scratch
// tables stay TEMP (pg_temp is searched before any schema). The session holds
// a session advisory lock on its run (runLock) while it runs, so that a plain
// audit drops the schemas of runs no audit holds and no stop point names
// (dropOrphanRuns): a run killed by SIGKILL stored no stop point.

// runPrefix begins a run's schema's name; runSchemaPattern is its whole form
// (as 00028's constraint audit_checkpoints_stop_sets).
const (
	runPrefix        = "audit_sets_"
	runSchemaPattern = `^audit_sets_[0-9a-f]{16}$`
)

// runLock is the bigint of a run's session advisory lock, of its schema $1.
const runLock = `hashtextextended('ledger audit sets ' || $1, 0)`

// dropRunTimeout bounds dropping a run's schema when the audit ends.
const dropRunTimeout = time.Minute

// newRunSets takes a session of pool for a full audit's sets in a new run's
// schema, after dropping the runs left behind (dropOrphanRuns). A role without
// CREATE on the database gets its session's TEMP tables instead, not
// resumable, and log says so.
func newRunSets(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (*pgSets, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: sets: %w", err)
	}
	s := &pgSets{conn: conn, pool: pool, log: log, sums: rowSums{whole: true}}
	err = s.createRun(ctx)
	if pgerr.Is(err, pgerr.InsufficientPrivilege) { // CREATE on the database, for a schema
		log.Warn("audit: the role may not create a schema (CREATE on the database): the audit's sets are its session's TEMP tables, and a stopped audit stores no stop point to resume from", "err", err)
		err = s.tempTables(ctx)
	} else if err == nil {
		err = s.dropOrphanRuns(ctx, log)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// createRun names a new run, takes its lock, and creates its schema and
// tables, first on the session's search_path. On an error no schema is left
// and s.run stays "".
func (s *pgSets) createRun(ctx context.Context) error {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("audit: sets: %w", err)
	}
	name := runPrefix + hex.EncodeToString(b[:])
	if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_lock(`+runLock+`)`, name); err != nil {
		return fmt.Errorf("audit: sets: %w", err)
	}
	schema := pgx.Identifier{name}.Sanitize()
	// One simple-protocol Exec: one implicit transaction, all or nothing.
	if _, err := s.conn.Exec(ctx, "CREATE SCHEMA "+schema+";\n"+historySchema("UNLOGGED TABLE "+schema+".")); err != nil {
		_, _ = s.conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+runLock+`)`, name)
		return err
	}
	s.run = name
	return s.attachRun(ctx)
}

// attachRun puts s.run's schema first on the session's search_path and
// creates the session's scratch tables.
func (s *pgSets) attachRun(ctx context.Context) error {
	_, err := s.conn.Exec(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), false)`, pgx.Identifier{s.run}.Sanitize())
	if err == nil {
		_, err = s.conn.Exec(ctx, scratchTables)
	}
	if err != nil {
		return fmt.Errorf("audit: sets: %s: %w", s.run, err)
	}
	return nil
}

// dropRun drops s.run's schema unless a stop point keeps it (s.keep), and
// releases its lock before the session is closed: a session's end releases
// it too, but after close returns (a resume at once would find it held). A
// session that broke (a query cancelled by a stop) held the lock no more:
// the schema is dropped from another, under the lock (dropBroken).
func (s *pgSets) dropRun() {
	if s.run == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropRunTimeout)
	defer cancel()
	if s.conn.Conn().IsClosed() {
		if !s.keep {
			s.dropBroken(ctx)
		}
		return
	}
	if !s.keep {
		s.dropSchema(ctx, s.run, s.logger())
	}
	_, _ = s.conn.Exec(ctx, `SELECT pg_advisory_unlock(`+runLock+`)`, s.run)
}

// dropBroken drops s.run's schema from another session of s.pool, as a run
// left behind (dropOrphanRun: under its lock, when no stop point names it).
func (s *pgSets) dropBroken(ctx context.Context) {
	conn, err := s.pool.Acquire(ctx)
	if err == nil {
		defer conn.Release()
		// The broken session's backend holds the run's lock until it has
		// noticed its client gone: wait for it (bounded by ctx), then drop as
		// a run left behind, which takes the lock again.
		if _, err = conn.Exec(ctx, `SELECT pg_advisory_lock(`+runLock+`), pg_advisory_unlock(`+runLock+`)`, s.run); err == nil {
			_, err = (&pgSets{conn: conn}).dropOrphanRun(ctx, s.run)
		}
	}
	if err != nil {
		s.logger().Warn("audit: a run's sets could not be dropped: the next full audit drops them", "schema", s.run, "err", err)
	}
}

func (s *pgSets) logger() *slog.Logger {
	if s.log == nil {
		return slog.Default()
	}
	return s.log
}

// dropSchema drops a run's schema; failing, it is logged and left to the
// next plain audit (dropOrphanRuns).
func (s *pgSets) dropSchema(ctx context.Context, run string, log *slog.Logger) {
	if _, err := s.conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{run}.Sanitize()+` CASCADE`); err != nil {
		log.Warn("audit: a run's sets could not be dropped: the next plain audit drops them", "schema", run, "err", err)
	}
}

// dropOrphanRuns drops the schemas of the runs that no audit holds (their
// lock is free) and no stop point names. Each is dropped holding its lock,
// and the stop points are read under it: an audit stores its stop point
// before its session ends, and a resume takes the lock before it reads. A
// schema that cannot be dropped (another role's) is logged and left.
func (s *pgSets) dropOrphanRuns(ctx context.Context, log *slog.Logger) error {
	rows, err := s.conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname ~ $1 AND nspname <> $2 ORDER BY 1`, runSchemaPattern, s.run)
	if err != nil {
		return fmt.Errorf("audit: sets: runs left behind: %w", err)
	}
	runs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("audit: sets: runs left behind: %w", err)
	}
	for _, run := range runs {
		dropped, err := s.dropOrphanRun(ctx, run)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("audit: sets: %s: %w", run, err)
			}
			log.Warn("audit: a run's sets left behind could not be dropped", "schema", run, "err", err)
		} else if dropped {
			log.Info("audit: dropped the sets of a run no audit holds and no stop point names", "schema", run)
		}
	}
	return nil
}

// dropOrphanRun drops run's schema if its lock is free and no stop point
// names it.
func (s *pgSets) dropOrphanRun(ctx context.Context, run string) (bool, error) {
	var got bool
	if err := s.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+runLock+`)`, run).Scan(&got); err != nil || !got {
		return false, err
	}
	defer s.conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+runLock+`)`, run)
	named, err := projections.Checkpoints.AuditStopNames(ctx, s.conn, run)
	if err != nil || named {
		return false, err
	}
	_, err = s.conn.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{run}.Sanitize()+` CASCADE`)
	return err == nil, err
}
