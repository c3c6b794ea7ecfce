package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
)

// ErrDuplicateEventID is returned when an append would store an event ID that is
// already stored outside the idempotency rules: in another stream, at another
// revision of the same stream, or twice in one append. Event IDs are unique in this
// store (KurrentDB would write such an event a second time instead). The error is
// an *eventstore.DuplicateEventIDError naming the ID.
var ErrDuplicateEventID = eventstore.ErrDuplicateEventID

// ErrClosed is returned by every operation after Close.
var ErrClosed = errors.New("eventstore/postgres: store closed")

var (
	_ eventstore.Store         = (*Store)(nil)
	_ eventstore.MultiAppender = (*Store)(nil)
	_ eventstore.EventLocator  = (*Store)(nil)
	_ eventstore.SnapshotStore = (*Store)(nil)
	_ eventstore.DurableReader = (*Store)(nil)
)

// Store is the PostgreSQL event store. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	owned bool // Close closes the pool

	// ctx is cancelled by Close; it ends subscriptions.
	ctx    context.Context
	cancel context.CancelFunc
	subs   sync.WaitGroup
	once   sync.Once

	wakeMu sync.Mutex
	wake   chan struct{} // closed (and replaced) after each commit of this process

	// PollInterval is how often a caught-up subscription looks for new events
	// written by other processes (appends of this Store wake it at once).
	PollInterval time.Duration

	// beforeCommit, when set (by tests), runs between an append's two round
	// trips, on its connection inside its open transaction.
	beforeCommit func(ctx context.Context, conn *pgx.Conn)

	// lastPages is, by page limit, the number of events the last ReadAll of
	// that limit returned: the next one's first guess of its page's size
	// (readAll). By limit, since one Store serves several readers of "all" at
	// once (a node's projector runner, publisher and process subscription),
	// each with a limit of its own: one reader's full page must not size
	// another's empty poll. Its size is the number of limits readers use.
	lastPages sync.Map // int -> *atomic.Int64
}

// DefaultPollInterval is the default Store.PollInterval.
const DefaultPollInterval = 20 * time.Millisecond

// Open connects to the database at url (a pgx URL or DSN; pool settings such as
// pool_max_conns are accepted). The events table must exist: see migrations.Up.
func Open(ctx context.Context, url string) (*Store, error) { return open(ctx, url, true) }

// OpenReader is Open for a process that only reads the store (ledger replay):
// its connections skip the round trip that watching commits for a cancelled
// wait for the standby costs (WatchSyncReplication), and an append on it is
// refused.
func OpenReader(ctx context.Context, url string) (*Store, error) { return open(ctx, url, false) }

func open(ctx context.Context, url string, appends bool) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("eventstore/postgres: %w", err)
	}
	if appends {
		WatchSyncReplication(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, classify(ctx, "open", err)
	}
	// One connection made now, so that a wrong URL fails here; a ping would
	// cost a round trip more.
	c, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, classify(ctx, "open", err)
	}
	c.Release()
	s := New(pool)
	s.owned = true
	return s, nil
}

// New returns a Store on pool. Close does not close a pool given to New. The
// pool must be made from a config prepared by WatchSyncReplication: appends on
// any other are refused.
func New(pool *pgxpool.Pool) *Store {
	ctx, cancel := context.WithCancel(context.Background())
	return &Store{pool: pool, ctx: ctx, cancel: cancel, wake: make(chan struct{}), PollInterval: DefaultPollInterval}
}

// Pool is the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close ends the subscriptions, waits for them and, for a Store from Open,
// closes the pool.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.subs.Wait()
		if s.owned {
			s.pool.Close()
		}
	})
	return nil
}

func (s *Store) closed() bool { return s.ctx.Err() != nil }

// notify wakes this process's subscriptions after a commit.
func (s *Store) notify() {
	s.wakeMu.Lock()
	close(s.wake)
	s.wake = make(chan struct{})
	s.wakeMu.Unlock()
}

func (s *Store) wakeChan() <-chan struct{} {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return s.wake
}

// ---- errors ----

// classify wraps a driver error: the context's error when ctx is done (a deadline
// also counts as ErrUnavailable: no answer in time), ErrUnavailable for transport
// failures and for server errors worth retrying, the server error otherwise.
func classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("eventstore/postgres: %s: %w: %w (%v)", op, eventstore.ErrUnavailable, cerr, err)
		}
		return fmt.Errorf("eventstore/postgres: %s: %w (%v)", op, cerr, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if transientCode(pgErr.Code) {
			return fmt.Errorf("eventstore/postgres: %s: %w: %w", op, eventstore.ErrUnavailable, err)
		}
		return fmt.Errorf("eventstore/postgres: %s: %w", op, err)
	}
	// No answer from the server: connection refused or lost, pool closed, timeout.
	return fmt.Errorf("eventstore/postgres: %s: %w: %w", op, eventstore.ErrUnavailable, err)
}

func transientCode(code string) bool {
	if pgerr.InClass(code, pgerr.ClassConnectionException) || pgerr.InClass(code, pgerr.ClassInsufficientResources) {
		return true
	}
	switch code {
	case pgerr.AdminShutdown, pgerr.CrashShutdown, pgerr.CannotConnectNow,
		pgerr.QueryCanceled, // statement_timeout
		pgerr.SerializationFailure, pgerr.DeadlockDetected,
		pgerr.LockNotAvailable: // lock_timeout
		return true
	}
	return false
}

func wrongRevision(stream string, expected eventstore.ExpectedRevision, actual int64) error {
	return &eventstore.WrongExpectedRevisionError{Stream: stream, Expected: expected, Actual: actual}
}

// ---- append ----

// Append implements eventstore.Appender.
func (s *Store) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	return eventstore.AppendOne(ctx, s, eventstore.StreamAppend{Stream: stream, Expected: expected, Events: events})
}

// AppendMulti implements eventstore.MultiAppender: one transaction for all parts.
// Parts whose events are already there (idempotent re-append) return the
// original write; the others are written.
//
// The common path costs two round trips (see begin and commit); an idempotent
// or conflicting part may cost more to check; a failed INSERT costs one more for
// the ROLLBACK.
func (s *Store) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) (res []eventstore.AppendResult, err error) {
	b, err := s.begin(ctx, parts)
	if err != nil {
		return nil, err
	}
	c, plans := b.conn, b.plans
	defer release(ctx, c)
	if s.beforeCommit != nil {
		s.beforeCommit(ctx, c.Conn())
	}
	if err := commit(ctx, c.Conn(), plans); err != nil {
		return nil, err
	}
	s.notify()
	return results(plans), nil
}

// AppendHeld performs an append in a transaction and returns without committing
// it: commit or rollback ends it. It exists for tests that need a transaction
// held open across a later commit (the "all" reader must not skip it). The
// stream stays locked until then: appends to it wait. It takes the slower path
// (INSERT in a round trip of its own) and holds a pooled connection until ended.
func (s *Store) AppendHeld(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.HeldAppend, error) {
	b, err := s.begin(ctx, []eventstore.StreamAppend{{Stream: stream, Expected: expected, Events: events}})
	if err != nil {
		return eventstore.HeldAppend{}, err
	}
	c, plans := b.conn, b.plans
	if args := insertArgs(plans); args != nil {
		rows, qerr := c.Conn().Query(ctx, insertSQL, args...)
		if qerr == nil {
			qerr = scanInserted(rows, plans)
		}
		if qerr != nil {
			release(ctx, c)
			return eventstore.HeldAppend{}, insertErr(ctx, plans, qerr)
		}
	}
	var once sync.Once
	end := func(sql, op string) error {
		err := errors.New("eventstore/postgres: held append already ended")
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			defer release(ctx, c)
			defer s.notify()
			w, _ := watchOf(c.Conn().PgConn()) // begin saw it
			w.cancelled = nil
			tag, xerr := c.Conn().Exec(ctx, sql)
			if xerr != nil {
				err = classify(ctx, op, xerr)
				return
			}
			err = nil
			switch {
			case sql == "COMMIT" && tag.String() != "COMMIT":
				err = fmt.Errorf("eventstore/postgres: %s: %w (command tag %q)", op, pgx.ErrTxCommitRollback, tag)
			case sql == "COMMIT" && w.cancelled != nil:
				err = notReplicated(op, w.cancelled)
			}
		})
		return err
	}
	return eventstore.HeldAppend{
		Commit:   func() error { return end("COMMIT", "commit") },
		Rollback: func() error { return end("ROLLBACK", "rollback") },
	}, nil
}

// plan is one part's decision: write at head+1, or return the original write.
type plan struct {
	part   eventstore.StreamAppend
	head   int64 // last revision before the append, -1 for none
	write  bool
	result eventstore.AppendResult
}

func results(plans []plan) []eventstore.AppendResult {
	res := make([]eventstore.AppendResult, len(plans))
	for i, pl := range plans {
		res[i] = pl.result
	}
	return res
}

// querier is what the idempotency checks read through: the append's connection,
// inside its transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const (
	// lockOneSQL and lockManySQL take the streams' transaction-level advisory
	// locks. lockManySQL takes them one row at a time in the order of their keys:
	// the subquery is sorted (DISTINCT keeps the planner from flattening it, and a
	// volatile function is never pushed down into it), and the outer projection
	// locks its rows as they come.
	lockOneSQL  = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	lockManySQL = `SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(s, 0) AS k FROM unnest($1::text[]) AS s ORDER BY k) AS keys`
	headsSQL    = `SELECT s.stream, coalesce((SELECT max(e.revision) FROM events e WHERE e.stream = s.stream), -1)
		FROM unnest($1::text[]) AS s(stream)`
	insertSQL = `INSERT INTO events (stream, revision, event_id, type, data, metadata, subject)
		SELECT u.stream, u.revision, u.event_id, u.type, u.data, u.metadata, nullif(u.subject, '')
		FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::bytea[], $6::bytea[], $7::text[])
			WITH ORDINALITY AS u(stream, revision, event_id, type, data, metadata, subject, n)
		ORDER BY u.n
		RETURNING stream, revision, position, transaction_id::text AS xid`
)

// begin opens an append's transaction on a connection of its own, locks the
// streams, reads their heads and decides each part; on success the transaction
// is open (nothing written yet) and the caller must release the connection, on
// error nothing is left open.
//
// One round trip, one pipeline: BEGIN; the locks; the heads. The heads are read
// by a statement of their own after the locks: under READ COMMITTED each
// statement takes its snapshot when it starts, so theirs is taken after the locks
// were granted and sees every commit of the appends that held them before us.
// Should a statement fail (a lock timeout, a cancelled context), the server
// skips the rest up to the pipeline's Sync and leaves the transaction aborted:
// release rolls it back.
//
// Lock order and transaction ids. "All" is read in transaction-id (xid) order,
// so within a stream xid order must equal revision order. PostgreSQL assigns a
// transaction its xid at its first write, not at BEGIN. So the first statements
// take the streams' transaction-level advisory locks (which assign no xid), and
// only then do we read the heads and insert. Whoever wrote the stream before us
// held the same lock until it committed, so its xid was assigned before we got
// the lock and ours after: ours is larger. (A SELECT ... FOR UPDATE on a streams
// row taken *after* an xid was assigned would not give this.) A multi-stream
// append locks all its streams in the order of their lock keys, so two appends
// sharing streams cannot deadlock; colliding keys merely serialise.
func (s *Store) begin(ctx context.Context, parts []eventstore.StreamAppend) (b begun, err error) {
	if s.closed() {
		return begun{}, ErrClosed
	}
	if err := validate(parts); err != nil {
		return begun{}, err
	}
	if err := ctx.Err(); err != nil {
		return begun{}, fmt.Errorf("eventstore/postgres: append: %w", err)
	}
	acquired, err := s.pool.Acquire(ctx)
	if err != nil {
		return begun{}, classify(ctx, "begin", err)
	}
	defer func() {
		if err != nil {
			release(ctx, acquired) // the returns below leave b empty
		}
	}()
	conn := acquired.Conn()
	if _, err := watchOf(conn.PgConn()); err != nil {
		return begun{}, err
	}
	registerArrays(conn.TypeMap())
	heads, err := lockStreams(ctx, conn, parts)
	if err != nil {
		return begun{}, err
	}
	plans, err := planParts(ctx, conn, parts, heads)
	if err != nil {
		return begun{}, err
	}
	return begun{conn: acquired, plans: plans}, nil
}

// begun is an append begun: its connection, in a transaction that holds the
// streams' locks, and each part's plan, decided on the heads read under them.
// Committing (commit) or rolling back ends it; release gives the connection
// back.
type begun struct {
	conn  *pgxpool.Conn
	plans []plan
}

// lockStreams is begin's one round trip: BEGIN, the streams' locks, then their
// heads (the last revision of each, -1 for none), read after the locks.
func lockStreams(ctx context.Context, conn *pgx.Conn, parts []eventstore.StreamAppend) (map[string]int64, error) {
	streams := make([]string, len(parts))
	for i, p := range parts {
		streams[i] = p.Stream
	}
	heads := make(map[string]int64, len(parts))
	var b pgx.Batch
	b.Queue("BEGIN")
	if len(streams) == 1 {
		b.Queue(lockOneSQL, streams[0])
	} else {
		b.Queue(lockManySQL, streams)
	}
	b.Queue(headsSQL, streams).Query(func(rows pgx.Rows) error {
		var name string
		var head int64
		_, err := pgx.ForEachRow(rows, []any{&name, &head}, func() error { heads[name] = head; return nil })
		return err
	})
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		return nil, classify(ctx, "lock streams", err)
	}
	if st := conn.PgConn().TxStatus(); st != 'T' {
		return nil, fmt.Errorf("eventstore/postgres: lock streams: connection in transaction status %q after BEGIN, want 'T'", st)
	}
	return heads, nil
}

// planParts decides each part against its stream's head: write it, return the
// original write, or refuse the append (a wrong revision, or a part written
// after an earlier part of its stream was found already stored).
func planParts(ctx context.Context, conn *pgx.Conn, parts []eventstore.StreamAppend, heads map[string]int64) ([]plan, error) {
	plans := make([]plan, len(parts))
	matched := map[string]bool{} // streams with a part already stored
	for i, p := range parts {
		if len(p.Events) == 0 { // an assertion of the stream's revision: nothing to write
			if last, _ := p.Expected.LastBefore(); last != heads[p.Stream] {
				return nil, wrongRevision(p.Stream, p.Expected, heads[p.Stream])
			}
			plans[i] = plan{part: p, head: heads[p.Stream]}
			continue
		}
		var err error
		if plans[i], err = decide(ctx, conn, p, heads[p.Stream]); err != nil {
			return nil, err
		}
		switch {
		case plans[i].write && matched[p.Stream]:
			return nil, wrongRevision(p.Stream, p.Expected, heads[p.Stream])
		case plans[i].write: // a later part of the same stream follows this one
			heads[p.Stream] += int64(len(p.Events))
		default:
			matched[p.Stream] = true
		}
	}
	return plans, nil
}

// commit ends an append begun by begin in one round trip, one pipeline: the
// INSERT ... RETURNING of the parts to be written, and COMMIT. If the INSERT
// fails, the server skips the COMMIT and the transaction is left aborted for
// release to roll back. A COMMIT of a transaction that was already aborted is
// answered ROLLBACK: that is an error too.
//
// A failure the server did not answer (a lost connection, a cancelled context)
// leaves the outcome unknown: INSERT and COMMIT may both have run. Retrying with
// the same event IDs is safe (idempotent) and tells.
//
// A COMMIT answered with the warning of a cancelled wait for the synchronous
// standby is not a success either: ErrNotReplicated (see syncrep.go).
func commit(ctx context.Context, conn *pgx.Conn, plans []plan) error {
	w, err := watchOf(conn.PgConn())
	if err != nil {
		return err
	}
	w.cancelled = nil
	var b pgx.Batch
	args := insertArgs(plans)
	if args != nil {
		b.Queue(insertSQL, args...)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, &b)
	if args != nil {
		rows, err := br.Query()
		if err == nil {
			err = scanInserted(rows, plans)
		}
		if err != nil {
			br.Close()
			return insertErr(ctx, plans, outcome(err))
		}
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return classify(ctx, "commit", outcome(err))
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("eventstore/postgres: commit: %w (command tag %q)", pgx.ErrTxCommitRollback, tag)
	}
	if w.cancelled != nil {
		return notReplicated("commit", w.cancelled)
	}
	return nil
}

// errUnknownOutcome marks a failure of the round trip carrying COMMIT that the
// server did not answer: the transaction may have committed.
var errUnknownOutcome = errors.New("outcome unknown, the append may have committed")

func outcome(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
		return err // answered by the server, or never sent: not committed
	}
	return fmt.Errorf("%w: %w", errUnknownOutcome, err)
}

// release returns c to the pool with no transaction left open on it: it rolls
// back one still open (or aborted), and closes the connection when that fails;
// the pool destroys a connection that is closed, busy or not idle.
func release(ctx context.Context, c *pgxpool.Conn) {
	conn := c.Conn()
	if !conn.IsClosed() && !conn.PgConn().IsBusy() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
			_ = conn.Close(rctx)
		}
		cancel()
	}
	c.Release()
}

func validate(parts []eventstore.StreamAppend) error {
	if len(parts) == 0 {
		return errors.New("eventstore/postgres: append of no streams")
	}
	for _, p := range parts {
		if p.Stream == "" {
			return errors.New("eventstore/postgres: append to an empty stream name")
		}
		if _, exact := p.Expected.LastBefore(); len(p.Events) == 0 && !exact {
			return fmt.Errorf("eventstore/postgres: append of no events to %q without an exact expected revision to assert", p.Stream)
		}
	}
	return nil
}

// stored is what the idempotency check needs of an event already in the stream.
type stored struct {
	revision int64
	id       uuid.UUID
	typ      string
	pos      eventstore.Position
}

// storedRange returns the stream's events at revisions from..to.
func storedRange(ctx context.Context, q querier, stream string, from, to int64) ([]stored, error) {
	rows, err := q.Query(ctx, `SELECT revision, event_id, type, transaction_id::text AS xid, position FROM events
		WHERE stream = $1 AND revision BETWEEN $2 AND $3 ORDER BY revision`, stream, from, to)
	if err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	var out []stored
	var st stored
	var xid string
	var pos int64
	_, err = pgx.ForEachRow(rows, []any{&st.revision, (*[16]byte)(&st.id), &st.typ, &xid, &pos}, func() error {
		p, err := position(xid, pos)
		st.pos = p
		out = append(out, st)
		return err
	})
	if err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	return out, nil
}

// repeated is the plan of an append whose events must already sit, in order,
// at revisions first.. of its stream (eventstore.SameEvent): when they do, the
// result of their original write, idempotent; when they do not, the append
// conflicts. A part that MustBeNew conflicts.
func repeated(ctx context.Context, q querier, pl plan, first int64) (plan, error) {
	p, n := pl.part, int64(len(pl.part.Events))
	if p.MustBeNew {
		return pl, wrongRevision(p.Stream, p.Expected, pl.head)
	}
	got, err := storedRange(ctx, q, p.Stream, first, first+n-1)
	if err != nil {
		return pl, err
	}
	if int64(len(got)) != n {
		return pl, wrongRevision(p.Stream, p.Expected, pl.head)
	}
	for i, st := range got {
		if st.revision != first+int64(i) || !eventstore.SameEvent(p.Events[i], st.id, st.typ) {
			return pl, wrongRevision(p.Stream, p.Expected, pl.head)
		}
	}
	pl.result = eventstore.AppendResult{
		FirstRevision: uint64(first),
		LastRevision:  uint64(first + n - 1),
		Position:      got[len(got)-1].pos,
		Idempotent:    true,
	}
	return pl, nil
}

// decide applies KurrentDB's IndexWriter rules (see eventstore.Appender) to one
// part, under its stream's lock.
func decide(ctx context.Context, q querier, p eventstore.StreamAppend, head int64) (plan, error) {
	pl := plan{part: p, head: head}
	n := int64(len(p.Events))
	if last, ok := p.Expected.LastBefore(); ok { // NoStream, Exact
		switch {
		case last == head:
			pl.write = true
			return pl, nil
		case last > head:
			return pl, wrongRevision(p.Stream, p.Expected, head)
		}
		// Before the head: idempotent only when every event already sits at
		// last+1+i; a mismatch or a batch running past the head is a conflict.
		if last+n > head {
			return pl, wrongRevision(p.Stream, p.Expected, head)
		}
		return repeated(ctx, q, pl, last+1)
	}
	if p.Expected.IsStreamExists() && head < 0 {
		return pl, wrongRevision(p.Stream, p.Expected, head)
	}
	// Any, StreamExists: idempotent when the first event's ID is in this stream
	// (and the rest follow it); written at the head otherwise.
	var first int64
	err := q.QueryRow(ctx, "SELECT revision FROM events WHERE event_id = $1 AND stream = $2", p.Events[0].ID, p.Stream).Scan(&first)
	if errors.Is(err, pgx.ErrNoRows) {
		pl.write = true
		return pl, nil
	}
	if err != nil {
		return pl, classify(ctx, "read event", err)
	}
	return repeated(ctx, q, pl, first)
}

// insertArgs are the arguments of insertSQL for the parts to be written, nil
// when there are none.
func insertArgs(plans []plan) []any {
	n := 0
	for _, pl := range plans {
		if pl.write {
			n += len(pl.part.Events)
		}
	}
	if n == 0 {
		return nil
	}
	var (
		streams   = make(textArray, 0, n)
		revisions = make(int8Array, 0, n)
		ids       = make(uuidArray, 0, n) // not uuid.UUID: pgx encodes a driver.Valuer through its text form
		types     = make(textArray, 0, n)
		data      = make(byteaArray, 0, n)
		metadata  = make(byteaArray, 0, n)
		subjects  = make(textArray, 0, n)
	)
	for _, pl := range plans {
		if !pl.write {
			continue
		}
		for i, e := range pl.part.Events {
			streams = append(streams, pl.part.Stream)
			revisions = append(revisions, pl.head+1+int64(i))
			ids = append(ids, e.ID)
			types = append(types, e.Type)
			// nonNil: an empty value, never NULL, in whichever format pgx
			// sends the array (encodeArray's binary one writes nil as empty;
			// a text one would write NULL, which the columns refuse).
			data = append(data, nonNil(e.Data))
			metadata = append(metadata, nonNil(e.Metadata))
			subjects = append(subjects, e.Subject)
		}
	}
	return []any{streams, revisions, ids, types, data, metadata, subjects}
}

// scanInserted reads what insertSQL returned and fills the written parts' results.
func scanInserted(rows pgx.Rows, plans []plan) error {
	type key struct {
		stream   string
		revision int64
	}
	written := make(map[key]eventstore.Position)
	var k key
	var pos int64
	var xid string
	_, err := pgx.ForEachRow(rows, []any{&k.stream, &k.revision, &pos, &xid}, func() error {
		p, err := position(xid, pos)
		written[k] = p
		return err
	})
	if err != nil {
		return err
	}
	for i := range plans {
		pl := &plans[i]
		if !pl.write {
			continue
		}
		last := pl.head + int64(len(pl.part.Events))
		p, ok := written[key{pl.part.Stream, last}]
		if !ok {
			return fmt.Errorf("eventstore/postgres: insert returned no row for %q at revision %d", pl.part.Stream, last)
		}
		pl.result = eventstore.AppendResult{
			FirstRevision: uint64(pl.head + 1),
			LastRevision:  uint64(last),
			Position:      p,
		}
	}
	return nil
}

func insertErr(ctx context.Context, plans []plan, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerr.UniqueViolation && pgErr.ConstraintName == "events_event_id_key" {
		// Detail: Key (event_id)=(<uuid>) already exists.
		_, rest, _ := strings.Cut(pgErr.Detail, ")=(")
		id, perr := uuid.Parse(strings.TrimSuffix(strings.TrimSuffix(rest, "."), ") already exists"))
		if perr != nil {
			return fmt.Errorf("%w: %s", ErrDuplicateEventID, pgErr.Detail)
		}
		parts := make([]eventstore.StreamAppend, len(plans))
		for i, pl := range plans {
			parts[i] = pl.part
		}
		return eventstore.DuplicateIn(parts, id)
	}
	return classify(ctx, "insert", err)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func position(xid string, pos int64) (eventstore.Position, error) {
	commit, err := strconv.ParseUint(xid, 10, 64)
	if err != nil {
		return eventstore.Position{}, fmt.Errorf("eventstore/postgres: transaction id %q: %w", xid, err)
	}
	return eventstore.Position{Commit: commit, Prepare: uint64(pos)}, nil
}

// positionOf is position of the bytes of a transaction id, without a string
// unless it is not a plain decimal.
func positionOf(xid []byte, pos int64) (eventstore.Position, error) {
	if commit, ok := decimal(xid); ok {
		return eventstore.Position{Commit: commit, Prepare: uint64(pos)}, nil
	}
	return position(string(xid), pos)
}

// decimal reads an unsigned decimal integer as strconv.ParseUint(s, 10, 64)
// does, without a string; false where ParseUint fails, or for a leading zero
// (then ParseUint decides).
func decimal(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 || b[0] == '0' && len(b) > 1 { // 19 digits never overflow
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// ---- reads ----

// eventColumns are read by scanEvents. The text form of the xid has its own name:
// named transaction_id, it would be what ORDER BY transaction_id sorts on (as text!).
const eventColumns = `position, transaction_id::text AS xid, stream, revision, event_id, type, data, metadata, created`

// scanEvents reads the rows of a read. Per event it allocates the stream's
// name only: the events share their slice (room for hint events at first,
// then grown as rows come, doubling (growEvents): a read's limit says nothing
// of how many rows it returns, and the ledger's and the projector's reads ask
// for thousands and mostly get a few or none; readAll's hint is its last
// page's size, pageHint), their
// types' names (one per type a read) and blocks holding their data and
// metadata (eventBytes), so a page of the audit or a rebuild is a few objects
// for the collector, not six an event. The transaction id is read without a
// string.
func scanEvents(rows pgx.Rows, hint int) ([]eventstore.RecordedEvent, error) {
	var (
		out                []eventstore.RecordedEvent
		e                  eventstore.RecordedEvent
		pos, rev           int64
		xid, typ, data, md pgtype.DriverBytes
		types              = map[string]string{}
		bytes              eventBytes
	)
	if hint > 0 {
		out = make([]eventstore.RecordedEvent, 0, hint)
	}
	_, err := pgx.ForEachRow(rows, []any{&pos, &xid, &e.Stream, &rev, (*[16]byte)(&e.ID), &typ, &data, &md, &e.Created}, func() error {
		p, err := positionOf(xid, pos)
		e.Position = p
		e.Revision = uint64(rev)
		e.Type = typeName(types, typ)
		e.Data, e.Metadata = bytes.copy(data), bytes.copy(md)
		out = append(growEvents(out), e)
		return err
	})
	return out, err
}

// growEvents returns events with room for one more, its capacity doubled when
// full: append alone grows a slice of more than 256 by a quarter, which for a
// page of 5,000 events allocates about five times the page in all (a rebuild's
// and an audit's largest allocation by bytes), doubling about twice.
func growEvents(events []eventstore.RecordedEvent) []eventstore.RecordedEvent {
	if len(events) < cap(events) {
		return events
	}
	return slices.Grow(events, max(len(events), 8))
}

// typeName is an event type's name, one string per name a read meets.
func typeName(types map[string]string, b []byte) string {
	if s, ok := types[string(b)]; ok {
		return s
	}
	s := string(b)
	types[s] = s
	return s
}

// eventBytes copies the events' data and metadata of one read into blocks,
// the first of minBlockBytes, each next one twice the last up to
// maxBlockBytes (a longer value gets a block of its own): a read of a few
// events allocates about what they hold, a page of thousands a few 64 KiB
// blocks. Each value is a full slice (its capacity its length), so appending
// to one never writes into the next. An event kept after its read keeps its
// block (at most 64 KiB) alive: a reader that keeps events beyond their page
// copies what it keeps (the audit's events-out gaps).
type eventBytes struct {
	block []byte
	next  int // the size of the next block
}

const (
	minBlockBytes = 1 << 10
	maxBlockBytes = 64 << 10
)

func (b *eventBytes) copy(v []byte) []byte {
	switch {
	case v == nil: // NULL, as pgx reads it into a []byte
		return nil
	case len(v) == 0:
		return []byte{}
	case len(v) > cap(b.block)-len(b.block):
		b.next = min(max(2*b.next, minBlockBytes), maxBlockBytes)
		b.block = make([]byte, 0, max(b.next, len(v)))
	}
	start := len(b.block)
	b.block = append(b.block, v...)
	return b.block[start:len(b.block):len(b.block)]
}

func limit(max int) any {
	if max <= 0 {
		return nil // LIMIT NULL: all
	}
	return int64(max)
}

// ReadStream implements eventstore.StreamReader, in one statement: the page,
// or, when the page is empty, the stream's head event, which says the stream
// exists (and is outside the range: dropped). No row: the stream does not
// exist. One snapshot answers both, so a stream created meanwhile is either
// seen whole or not at all.
func (s *Store) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/postgres: read stream: %w", err)
	}
	start := int64(math.MaxInt64)
	if from < math.MaxInt64 {
		start = int64(from)
	}
	q := readStreamForwards
	if dir == eventstore.Backwards {
		q = readStreamBackwards
	}
	rows, err := s.pool.Query(ctx, q, stream, start, limit(max))
	if err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	out, err := scanEvents(rows, 0)
	if err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %q", eventstore.ErrStreamNotFound, stream)
	}
	// An empty page reads the head alone, outside the range: the stream ends
	// before a forwards range, or starts after a backwards one.
	if head := out[0].Revision; dir == eventstore.Backwards && head > uint64(start) || dir != eventstore.Backwards && head < uint64(start) {
		return nil, nil
	}
	return out, nil
}

// ReadCold implements eventstore.ColdReader in one statement whatever the
// number of streams: each one's snapshot (its data on the first row only)
// and its events from the snapshot's revision (one index descent per stream,
// LATERAL). A stream asked twice is read once, both answers sharing what was
// read.
func (s *Store) ReadCold(ctx context.Context, streams []string, max int) ([]eventstore.ColdStream, error) {
	if max < 1 {
		return nil, fmt.Errorf("eventstore/postgres: read cold: max %d is below 1", max)
	}
	if s.closed() {
		return nil, ErrClosed
	}
	read := make(map[string]*eventstore.ColdStream, len(streams))
	var names []string
	for _, st := range streams {
		if read[st] == nil {
			read[st] = &eventstore.ColdStream{}
			names = append(names, st)
		}
	}
	rows, err := s.pool.Query(ctx, `SELECT r.s, sn.revision, CASE WHEN e.revision IS NULL OR e.revision = sn.revision THEN sn.data END, sn.taken,
			e.position, e.transaction_id::text, e.revision, e.event_id, e.type, e.data, e.metadata, e.created
		FROM unnest($1::text[]) AS r(s)
		LEFT JOIN snapshots sn ON sn.stream = r.s
		LEFT JOIN LATERAL (SELECT * FROM events e WHERE e.stream = r.s AND e.revision >= coalesce(sn.revision, 0) ORDER BY e.revision LIMIT $2) e ON true
		ORDER BY r.s, e.revision`, names, int64(max))
	if err != nil {
		return nil, classify(ctx, "read cold", err)
	}
	if err := scanCold(rows, read); err != nil {
		return nil, classify(ctx, "read cold", err)
	}
	out := make([]eventstore.ColdStream, len(streams))
	for i, st := range streams {
		out[i] = *read[st]
	}
	return out, nil
}

// scanCold reads ReadCold's rows into read (by stream).
func scanCold(rows pgx.Rows, read map[string]*eventstore.ColdStream) error {
	var (
		stream     string
		snapRev    *int64
		snapData   []byte
		snapTaken  *time.Time
		pos, rev   *int64
		xid, typ   *string
		id         *uuid.UUID
		data, meta []byte
		created    *time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&stream, &snapRev, &snapData, &snapTaken, &pos, &xid, &rev, &id, &typ, &data, &meta, &created}, func() error {
		c := read[stream]
		if snapRev != nil && snapData != nil {
			c.Snapshot = &eventstore.Snapshot{Stream: stream, Revision: uint64(*snapRev), Data: snapData, Taken: *snapTaken}
		}
		snapData = nil
		if pos == nil {
			return nil // no event: the stream does not exist, or ends before its snapshot
		}
		p, err := position(*xid, *pos)
		c.Events = append(c.Events, eventstore.RecordedEvent{Position: p, Stream: stream, Revision: uint64(*rev), ID: *id, Type: *typ, Data: data, Metadata: meta, Created: *created})
		data, meta = nil, nil // fresh slices for the next row
		return err
	})
	return err
}

// readStreamQuery is ReadStream's statement: the page in the range (cond, in
// order), and only when it is empty the stream's head event. The head is one
// backward descent of events_stream_revision_key.
func readStreamQuery(cond, order string) string {
	return `WITH page AS MATERIALIZED (
		SELECT ` + eventColumns + ` FROM events WHERE stream = $1 AND ` + cond + ` ORDER BY revision ` + order + ` LIMIT $3)
	SELECT * FROM (
		SELECT * FROM page
		UNION ALL
		SELECT * FROM (SELECT ` + eventColumns + ` FROM events WHERE stream = $1 ORDER BY revision DESC LIMIT 1) head
		WHERE NOT EXISTS (SELECT 1 FROM page)
	) r ORDER BY revision ` + order
}

var (
	readStreamForwards  = readStreamQuery("revision >= $2", "ASC")
	readStreamBackwards = readStreamQuery("revision <= $2", "DESC")
)

// VisibleBelow is the gap-safe horizon of "all" (ARCHITECTURE decision 8): every
// transaction with a smaller xid has ended, so no event can still appear below
// it. Rows at or above it are left for a later read, even when already
// committed, because a smaller running xid may yet commit events before them.
// The scalar subquery is evaluated once per statement, from the statement's own
// snapshot. The price: xids are cluster-wide, so any long write transaction on
// the cluster (in any database) holds "all" readers back until it ends.
// Exported so that a test waiting for the horizon (devtest.SettledAll) waits
// for this one.
const VisibleBelow = `(SELECT pg_snapshot_xmin(pg_current_snapshot()))`

// ReadAll implements eventstore.AllReader: up to max (max <= 0: all) events
// strictly after `after` in (transaction id, position) order, only from
// transactions below the oldest one still running, so that an event committed
// late is never skipped.
func (s *Store) ReadAll(ctx context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/postgres: read all: %w", err)
	}
	return s.readAll(ctx, after, max)
}

func (s *Store) readAll(ctx context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events
		WHERE (transaction_id, position) > ($1::text::xid8, $2)
		  AND transaction_id < `+VisibleBelow+`
		ORDER BY transaction_id, position
		LIMIT $3`, strconv.FormatUint(after.Commit, 10), prepareOf(after), limit(max))
	if err != nil {
		return nil, classify(ctx, "read all", err)
	}
	last := s.lastPage(max)
	out, err := scanEvents(rows, pageHint(last.Load(), max))
	if err != nil {
		return nil, classify(ctx, "read all", err)
	}
	last.Store(int64(len(out)))
	return out, nil
}

// lastPage is the size of the last page read of "all" with this limit (lastPages).
func (s *Store) lastPage(max int) *atomic.Int64 {
	if v, ok := s.lastPages.Load(max); ok {
		return v.(*atomic.Int64)
	}
	v, _ := s.lastPages.LoadOrStore(max, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// pageHint is the room a read of "all" of up to max events (max <= 0: all)
// makes for its page before its first row: as many as the last page of that
// limit held (last), up to max. A rebuild's or an audit's pages of thousands follow one
// another, and each is then one slice of its size, not one doubled up to it
// (with the copies on the way, about three times the page); a caught-up
// reader's polls of a few events or none get room for a few.
func pageHint(last int64, max int) int {
	if max <= 0 {
		return 0 // a read of everything: its size is not the last page's
	}
	return int(min(last, int64(max)))
}

// Head implements eventstore.Store: the position of the last event a reader of
// "all" can see now (Start when there is none).
func (s *Store) Head(ctx context.Context) (eventstore.Position, error) {
	if s.closed() {
		return eventstore.Position{}, ErrClosed
	}
	var xid string
	var pos int64
	err := s.pool.QueryRow(ctx, `SELECT transaction_id::text AS xid, position FROM events
		WHERE transaction_id < `+VisibleBelow+`
		ORDER BY transaction_id DESC, position DESC LIMIT 1`).Scan(&xid, &pos)
	if errors.Is(err, pgx.ErrNoRows) {
		return eventstore.Start, nil
	}
	if err != nil {
		return eventstore.Position{}, classify(ctx, "head", err)
	}
	p, err := position(xid, pos)
	return p, err
}

// ---- subscriptions ----

const (
	subscribeBatch   = 256
	defaultBuffer    = 512
	retryMin         = 20 * time.Millisecond
	retryMax         = time.Second
	retryGiveUpAfter = time.Minute
)

type subscription struct {
	events chan eventstore.RecordedEvent
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
}

func (sub *subscription) Events() <-chan eventstore.RecordedEvent { return sub.events }

func (sub *subscription) Err() error {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.err
}

func (sub *subscription) Close() error {
	sub.cancel()
	<-sub.done
	return nil
}

// SubscribeAll implements eventstore.Subscriber by reading "all" in batches,
// polling every PollInterval once caught up (woken at once by this Store's own
// commits). Transient failures are retried with a back-off of up to a second;
// after a minute of them, or at the first other failure, the subscription ends
// with Err set.
func (s *Store) SubscribeAll(ctx context.Context, after eventstore.Position, opts eventstore.SubscribeOptions) (eventstore.Subscription, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("eventstore/postgres: subscribe: %w", err)
	}
	size := opts.BufferSize
	if size <= 0 {
		size = defaultBuffer
	}
	prefixes := slices.Clone(opts.StreamPrefixes)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel) // Close ends it too
	sub := &subscription{events: make(chan eventstore.RecordedEvent, size), cancel: cancel, done: make(chan struct{})}
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		defer close(sub.done)
		defer close(sub.events)
		defer stop()
		defer cancel()
		if err := s.run(ctx, after, prefixes, sub.events); err != nil && ctx.Err() == nil {
			sub.mu.Lock()
			sub.err = err
			sub.mu.Unlock()
		}
	}()
	return sub, nil
}

func (s *Store) run(ctx context.Context, pos eventstore.Position, prefixes []string, out chan<- eventstore.RecordedEvent) error {
	poll := s.PollInterval
	if poll <= 0 {
		poll = DefaultPollInterval
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	wait := func(d time.Duration, wake <-chan struct{}) bool {
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
		case <-wake:
		}
		return true
	}
	var failingSince time.Time
	backoff := retryMin
	for {
		wake := s.wakeChan() // before the read: a commit after it wakes us
		batch, err := s.readAll(ctx, pos, subscribeBatch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !errors.Is(err, eventstore.ErrUnavailable) {
				return err
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > retryGiveUpAfter {
				return err
			}
			if !wait(backoff, nil) {
				return nil
			}
			backoff = min(2*backoff, retryMax)
			continue
		}
		failingSince, backoff = time.Time{}, retryMin
		for _, e := range batch {
			pos = e.Position
			if !matches(e.Stream, prefixes) {
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return nil
			}
		}
		if len(batch) < subscribeBatch && !wait(poll, wake) {
			return nil
		}
	}
}

func matches(stream string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if len(stream) >= len(p) && stream[:len(p)] == p {
			return true
		}
	}
	return false
}

// ReportsIdempotentAppends tells the conformance suite that AppendResult.Idempotent
// is reported by this store.
func (s *Store) ReportsIdempotentAppends() bool { return true }

// ReadStreamSubject implements eventstore.SubjectReader: one read of the
// partial index on (stream, subject).
func (s *Store) ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]eventstore.RecordedEvent, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	limit := "ALL"
	if max > 0 {
		limit = strconv.Itoa(max)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE stream = $1 AND subject = $2
		ORDER BY revision LIMIT `+limit, stream, subject)
	if err != nil {
		return nil, classify(ctx, "read stream subject", err)
	}
	out, err := scanEvents(rows, 0)
	if err != nil {
		return nil, classify(ctx, "read stream subject", err)
	}
	return out, nil
}

// ReadEventByID implements eventstore.EventLocator (one lookup in the unique
// index on event_id).
func (s *Store) ReadEventByID(ctx context.Context, id uuid.UUID) (eventstore.RecordedEvent, error) {
	if s.closed() {
		return eventstore.RecordedEvent{}, ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE event_id = $1`, id)
	if err != nil {
		return eventstore.RecordedEvent{}, classify(ctx, "read event", err)
	}
	out, err := scanEvents(rows, 0)
	if err != nil {
		return eventstore.RecordedEvent{}, classify(ctx, "read event", err)
	}
	if len(out) == 0 {
		return eventstore.RecordedEvent{}, fmt.Errorf("%w: %s", eventstore.ErrEventNotFound, id)
	}
	return out[0], nil
}

// EventsExist implements eventstore.EventLocator: one lookup of them all in the
// unique index on event_id.
func (s *Store) EventsExist(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT event_id FROM events WHERE event_id = ANY($1)`, rawIDs(ids))
	if err != nil {
		return nil, classify(ctx, "read events", err)
	}
	out := make(map[uuid.UUID]bool, len(ids))
	var id uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{(*[16]byte)(&id)}, func() error {
		out[id] = true
		return nil
	})
	return out, classify(ctx, "read events", err)
}

// ReadEventsByID implements eventstore.EventLocator: one read of them all
// through the unique index on event_id.
func (s *Store) ReadEventsByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]eventstore.RecordedEvent, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE event_id = ANY($1)`, rawIDs(ids))
	if err != nil {
		return nil, classify(ctx, "read events", err)
	}
	evs, err := scanEvents(rows, 0)
	if err != nil {
		return nil, classify(ctx, "read events", err)
	}
	out := make(map[uuid.UUID]eventstore.RecordedEvent, len(evs))
	for _, e := range evs {
		out[e.ID] = e
	}
	return out, nil
}

// rawIDs are ids as the driver sends them (not uuid.UUID: as insertArgs' ids).
func rawIDs(ids []uuid.UUID) [][16]byte {
	raw := make([][16]byte, len(ids))
	for i, id := range ids {
		raw[i] = id
	}
	return raw
}

// WriteSnapshot implements eventstore.SnapshotStore: one upsert that keeps the
// later of two snapshots of a stream.
func (s *Store) WriteSnapshot(ctx context.Context, snap eventstore.Snapshot) error {
	if s.closed() {
		return ErrClosed
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO snapshots (stream, revision, data) VALUES ($1, $2, $3)
		ON CONFLICT (stream) DO UPDATE SET revision = EXCLUDED.revision, data = EXCLUDED.data, taken = now()
		WHERE snapshots.revision <= EXCLUDED.revision`, snap.Stream, int64(snap.Revision), nonNil(snap.Data))
	return classify(ctx, "write snapshot", err)
}

// ReadSnapshot implements eventstore.SnapshotStore.
func (s *Store) ReadSnapshot(ctx context.Context, stream string) (eventstore.Snapshot, error) {
	snaps, err := s.readSnapshots(ctx, `WHERE stream = $1`, stream)
	if err != nil {
		return eventstore.Snapshot{}, err
	}
	if len(snaps) == 0 {
		return eventstore.Snapshot{}, fmt.Errorf("%w: %q", eventstore.ErrSnapshotNotFound, stream)
	}
	return snaps[0], nil
}

// ReadSnapshots implements eventstore.SnapshotStore.
func (s *Store) ReadSnapshots(ctx context.Context, after string, max int) ([]eventstore.Snapshot, error) {
	return s.readSnapshots(ctx, `WHERE stream > $1 ORDER BY stream LIMIT $2`, after, limit(max))
}

func (s *Store) readSnapshots(ctx context.Context, where string, args ...any) ([]eventstore.Snapshot, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT stream, revision, data, taken FROM snapshots `+where, args...)
	if err != nil {
		return nil, classify(ctx, "read snapshot", err)
	}
	var (
		snap eventstore.Snapshot
		rev  int64
	)
	out, err := pgx.AppendRows([]eventstore.Snapshot(nil), rows, func(row pgx.CollectableRow) (eventstore.Snapshot, error) {
		err := row.Scan(&snap.Stream, &rev, &snap.Data, &snap.Taken)
		snap.Revision = uint64(rev)
		return snap, err
	})
	return out, classify(ctx, "read snapshot", err)
}
