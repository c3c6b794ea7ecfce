package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
)

// ErrDuplicateEventID is returned when an append would store an event ID that is
// already stored outside the idempotency rules: in another stream, at another
// revision of the same stream, or twice in one append. Event IDs are unique in this
// store (KurrentDB would write such an event a second time instead).
var ErrDuplicateEventID = errors.New("eventstore/postgres: duplicate event ID")

// ErrClosed is returned by every operation after Close.
var ErrClosed = errors.New("eventstore/postgres: store closed")

var (
	_ eventstore.Store         = (*Store)(nil)
	_ eventstore.MultiAppender = (*Store)(nil)
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
}

// DefaultPollInterval is the default Store.PollInterval.
const DefaultPollInterval = 20 * time.Millisecond

// Open connects to the database at url (a pgx URL or DSN; pool settings such as
// pool_max_conns are accepted). The events table must exist: see migrations.Up.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("eventstore/postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, classify(ctx, "open", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, classify(ctx, "open", err)
	}
	s := New(pool)
	s.owned = true
	return s, nil
}

// New returns a Store on pool. Close does not close a pool given to New.
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
	switch {
	case len(code) == 5 && code[:2] == "08": // connection exception
		return true
	case len(code) == 5 && code[:2] == "53": // insufficient resources (too many connections...)
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", // admin/crash shutdown, cannot connect now
		"57014",          // query canceled (statement_timeout)
		"40001", "40P01", // serialization failure, deadlock
		"55P03": // lock not available (lock_timeout)
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
	res, err := s.AppendMulti(ctx, []eventstore.StreamAppend{{Stream: stream, Expected: expected, Events: events}})
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	return res[0], nil
}

// AppendMulti implements eventstore.MultiAppender: one transaction for all parts.
// Parts whose events are already there (idempotent re-append) return the
// original write; the others are written.
func (s *Store) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	tx, res, err := s.appendTx(ctx, parts)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		// The outcome is unknown when the connection broke during COMMIT: retrying
		// with the same event IDs is safe (idempotent) and tells.
		return nil, classify(ctx, "commit", err)
	}
	s.notify()
	return res, nil
}

// AppendHeld performs an append in a transaction and returns without committing
// it: commit or rollback ends it. It exists for tests that need a transaction
// held open across a later commit (the "all" reader must not skip it). The
// stream stays locked until then: appends to it wait.
func (s *Store) AppendHeld(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (commit func() error, rollback func() error, err error) {
	tx, _, err := s.appendTx(ctx, []eventstore.StreamAppend{{Stream: stream, Expected: expected, Events: events}})
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	end := func(f func(context.Context) error, op string) error {
		err := errors.New("eventstore/postgres: held append already ended")
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = classify(ctx, op, f(ctx))
			s.notify()
		})
		return err
	}
	commit = func() error { return end(tx.Commit, "commit") }
	rollback = func() error { return end(tx.Rollback, "rollback") }
	return commit, rollback, nil
}

// plan is one part's decision: write at head+1, or return the original write.
type plan struct {
	part   eventstore.StreamAppend
	head   int64 // last revision before the append, -1 for none
	write  bool
	result eventstore.AppendResult
}

// appendTx runs an append up to (not including) COMMIT and returns the open
// transaction; on error it has been rolled back.
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
func (s *Store) appendTx(ctx context.Context, parts []eventstore.StreamAppend) (tx pgx.Tx, res []eventstore.AppendResult, err error) {
	if s.closed() {
		return nil, nil, ErrClosed
	}
	if err := validate(parts); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("eventstore/postgres: append: %w", err)
	}
	tx, err = s.pool.Begin(ctx)
	if err != nil {
		return nil, nil, classify(ctx, "begin", err)
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
			tx = nil
		}
	}()

	streams := make([]string, len(parts))
	for i, p := range parts {
		streams[i] = p.Stream
	}
	if err := lockStreams(ctx, tx, streams); err != nil {
		return tx, nil, classify(ctx, "lock streams", err)
	}

	heads := make(map[string]int64, len(parts))
	rows, err := tx.Query(ctx, `SELECT s.stream, coalesce((SELECT max(e.revision) FROM events e WHERE e.stream = s.stream), -1)
		FROM unnest($1::text[]) AS s(stream)`, streams)
	if err != nil {
		return tx, nil, classify(ctx, "read heads", err)
	}
	var name string
	var head int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &head}, func() error { heads[name] = head; return nil }); err != nil {
		return tx, nil, classify(ctx, "read heads", err)
	}

	plans := make([]plan, len(parts))
	for i, p := range parts {
		if plans[i], err = decide(ctx, tx, p, heads[p.Stream]); err != nil {
			return tx, nil, err
		}
	}
	if err := insert(ctx, tx, plans); err != nil {
		return tx, nil, err
	}
	res = make([]eventstore.AppendResult, len(plans))
	for i, pl := range plans {
		res[i] = pl.result
	}
	return tx, res, nil
}

func validate(parts []eventstore.StreamAppend) error {
	if len(parts) == 0 {
		return errors.New("eventstore/postgres: append of no streams")
	}
	seen := make(map[string]bool, len(parts))
	for _, p := range parts {
		if p.Stream == "" {
			return errors.New("eventstore/postgres: append to an empty stream name")
		}
		if seen[p.Stream] {
			return fmt.Errorf("eventstore/postgres: stream %q appears twice in one append", p.Stream)
		}
		seen[p.Stream] = true
		if len(p.Events) == 0 {
			return fmt.Errorf("eventstore/postgres: append of no events to %q", p.Stream)
		}
	}
	return nil
}

// lockStreams takes the streams' advisory transaction locks in key order.
func lockStreams(ctx context.Context, tx pgx.Tx, streams []string) error {
	if len(streams) == 1 {
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", streams[0])
		return err
	}
	rows, err := tx.Query(ctx, "SELECT DISTINCT hashtextextended(s, 0) AS k FROM unnest($1::text[]) AS s ORDER BY k", streams)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	// A batch runs its statements in order, in one round trip.
	var b pgx.Batch
	for _, k := range keys {
		b.Queue("SELECT pg_advisory_xact_lock($1)", k)
	}
	return tx.SendBatch(ctx, &b).Close()
}

// stored is what the idempotency check needs of an event already in the stream.
type stored struct {
	revision int64
	id       uuid.UUID
	pos      eventstore.Position
}

// storedRange returns the stream's events at revisions from..to.
func storedRange(ctx context.Context, tx pgx.Tx, stream string, from, to int64) ([]stored, error) {
	rows, err := tx.Query(ctx, `SELECT revision, event_id, transaction_id::text AS xid, position FROM events
		WHERE stream = $1 AND revision BETWEEN $2 AND $3 ORDER BY revision`, stream, from, to)
	if err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	var out []stored
	var st stored
	var xid string
	var pos int64
	_, err = pgx.ForEachRow(rows, []any{&st.revision, &st.id, &xid, &pos}, func() error {
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

// matchAt reports whether events sit, in order, at revisions first.. of the
// stream, and if so the AppendResult of their original write.
func matchAt(ctx context.Context, tx pgx.Tx, stream string, first int64, events []eventstore.EventData) (eventstore.AppendResult, bool, error) {
	n := int64(len(events))
	got, err := storedRange(ctx, tx, stream, first, first+n-1)
	if err != nil || int64(len(got)) != n {
		return eventstore.AppendResult{}, false, err
	}
	for i, st := range got {
		if st.revision != first+int64(i) || st.id != events[i].ID {
			return eventstore.AppendResult{}, false, nil
		}
	}
	return eventstore.AppendResult{
		FirstRevision: uint64(first),
		LastRevision:  uint64(first + n - 1),
		Position:      got[len(got)-1].pos,
	}, true, nil
}

// decide applies KurrentDB's IndexWriter rules (see eventstore.Appender) to one
// part, under its stream's lock.
func decide(ctx context.Context, tx pgx.Tx, p eventstore.StreamAppend, head int64) (plan, error) {
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
		res, ok, err := matchAt(ctx, tx, p.Stream, last+1, p.Events)
		if err != nil {
			return pl, err
		}
		if !ok {
			return pl, wrongRevision(p.Stream, p.Expected, head)
		}
		pl.result = res
		pl.result.Idempotent = true
		return pl, nil
	}
	if p.Expected.IsStreamExists() && head < 0 {
		return pl, wrongRevision(p.Stream, p.Expected, head)
	}
	// Any, StreamExists: idempotent when the first event's ID is in this stream
	// (and the rest follow it); written at the head otherwise.
	var first int64
	err := tx.QueryRow(ctx, "SELECT revision FROM events WHERE event_id = $1 AND stream = $2", p.Events[0].ID, p.Stream).Scan(&first)
	if errors.Is(err, pgx.ErrNoRows) {
		pl.write = true
		return pl, nil
	}
	if err != nil {
		return pl, classify(ctx, "read event", err)
	}
	res, ok, err := matchAt(ctx, tx, p.Stream, first, p.Events)
	if err != nil {
		return pl, err
	}
	if !ok {
		return pl, wrongRevision(p.Stream, p.Expected, head)
	}
	pl.result = res
	pl.result.Idempotent = true
	return pl, nil
}

// insert writes the parts to be written in one statement and fills their results.
func insert(ctx context.Context, tx pgx.Tx, plans []plan) error {
	var (
		streams   []string
		revisions []int64
		ids       []uuid.UUID
		types     []string
		data      [][]byte
		metadata  [][]byte
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
			data = append(data, nonNil(e.Data))
			metadata = append(metadata, nonNil(e.Metadata))
		}
	}
	if len(streams) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT u.stream, u.revision, u.event_id, u.type, u.data, u.metadata
		FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::bytea[], $6::bytea[])
			WITH ORDINALITY AS u(stream, revision, event_id, type, data, metadata, n)
		ORDER BY u.n
		RETURNING stream, revision, position, transaction_id::text AS xid`,
		streams, revisions, ids, types, data, metadata)
	if err != nil {
		return insertErr(ctx, err)
	}
	type key struct {
		stream   string
		revision int64
	}
	written := make(map[key]eventstore.Position, len(streams))
	var k key
	var pos int64
	var xid string
	_, err = pgx.ForEachRow(rows, []any{&k.stream, &k.revision, &pos, &xid}, func() error {
		p, err := position(xid, pos)
		written[k] = p
		return err
	})
	if err != nil {
		return insertErr(ctx, err)
	}
	for i := range plans {
		pl := &plans[i]
		if !pl.write {
			continue
		}
		last := pl.head + int64(len(pl.part.Events))
		pl.result = eventstore.AppendResult{
			FirstRevision: uint64(pl.head + 1),
			LastRevision:  uint64(last),
			Position:      written[key{pl.part.Stream, last}],
		}
	}
	return nil
}

func insertErr(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "events_event_id_key" {
		return fmt.Errorf("%w: %s", ErrDuplicateEventID, pgErr.Detail)
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

// ---- reads ----

// eventColumns are read by scanEvents. The text form of the xid has its own name:
// named transaction_id, it would be what ORDER BY transaction_id sorts on (as text!).
const eventColumns = `position, transaction_id::text AS xid, stream, revision, event_id, type, data, metadata, created`

func scanEvents(rows pgx.Rows) ([]eventstore.RecordedEvent, error) {
	var out []eventstore.RecordedEvent
	var (
		e   eventstore.RecordedEvent
		pos int64
		xid string
		rev int64
	)
	_, err := pgx.ForEachRow(rows, []any{&pos, &xid, &e.Stream, &rev, &e.ID, &e.Type, &e.Data, &e.Metadata, &e.Created}, func() error {
		p, err := position(xid, pos)
		e.Position = p
		e.Revision = uint64(rev)
		out = append(out, e)
		e.Data, e.Metadata = nil, nil // fresh slices for the next row
		return err
	})
	return out, err
}

func limit(max int) any {
	if max <= 0 {
		return nil // LIMIT NULL: all
	}
	return int64(max)
}

// ReadStream implements eventstore.StreamReader.
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
	var q string
	if dir == eventstore.Backwards {
		q = `SELECT ` + eventColumns + ` FROM events WHERE stream = $1 AND revision <= $2 ORDER BY revision DESC LIMIT $3`
	} else {
		q = `SELECT ` + eventColumns + ` FROM events WHERE stream = $1 AND revision >= $2 ORDER BY revision LIMIT $3`
	}
	read := func() ([]eventstore.RecordedEvent, error) {
		rows, err := s.pool.Query(ctx, q, stream, start, limit(max))
		if err != nil {
			return nil, classify(ctx, "read stream", err)
		}
		out, err := scanEvents(rows)
		if err != nil {
			return nil, classify(ctx, "read stream", err)
		}
		return out, nil
	}
	out, err := read()
	if err != nil || len(out) > 0 {
		return out, err
	}
	// Nothing read: a missing stream, or a range beyond its head. The stream may
	// have been created between the two statements; then read again: streams
	// never shrink, so what that read returns is consistent with "exists".
	var exists bool
	if err := s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM events WHERE stream = $1)", stream).Scan(&exists); err != nil {
		return nil, classify(ctx, "read stream", err)
	}
	if !exists {
		return nil, fmt.Errorf("%w: %q", eventstore.ErrStreamNotFound, stream)
	}
	return read()
}

// visibleBelow is the gap-safe horizon of "all" (ARCHITECTURE decision 8): every
// transaction with a smaller xid has ended, so no event can still appear below
// it. Rows at or above it are left for a later read, even when already
// committed, because a smaller running xid may yet commit events before them.
// The scalar subquery is evaluated once per statement, from the statement's own
// snapshot. The price: xids are cluster-wide, so any long write transaction on
// the cluster (in any database) holds "all" readers back until it ends.
const visibleBelow = `(SELECT pg_snapshot_xmin(pg_current_snapshot()))`

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
	prepare := int64(math.MaxInt64)
	if after.Prepare < math.MaxInt64 {
		prepare = int64(after.Prepare)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events
		WHERE (transaction_id, position) > ($1::text::xid8, $2)
		  AND transaction_id < `+visibleBelow+`
		ORDER BY transaction_id, position
		LIMIT $3`, strconv.FormatUint(after.Commit, 10), prepare, limit(max))
	if err != nil {
		return nil, classify(ctx, "read all", err)
	}
	out, err := scanEvents(rows)
	if err != nil {
		return nil, classify(ctx, "read all", err)
	}
	return out, nil
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
		WHERE transaction_id < `+visibleBelow+`
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
