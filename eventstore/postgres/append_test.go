package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
)

// countingConn counts the writes to a connection: pgx writes each round trip's
// messages in one write (a pipeline is flushed at its Sync).
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// openPool opens a store on a pool of at most max connections given to New,
// counting the writes to them in writes when not nil.
func openPool(t *testing.T, url string, max int32, writes *atomic.Int64) (*postgres.Store, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = max
	postgres.WatchSyncReplication(cfg)
	if writes != nil {
		dialer := &net.Dialer{KeepAlive: 5 * time.Minute}
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: c, writes: writes}, nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := postgres.New(pool)
	t.Cleanup(func() { s.Close(); pool.Close() })
	return s, pool
}

func part(stream string, exp eventstore.ExpectedRevision, n int) eventstore.StreamAppend {
	p := eventstore.StreamAppend{Stream: stream, Expected: exp}
	for range n {
		p.Events = append(p.Events, ev())
	}
	return p
}

// connect opens a connection of the test's own, closed when t ends.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// wantClean fails t unless the pool holds no connection of an append and no
// session of the database is left inside a transaction.
func wantClean(t *testing.T, pool *pgxpool.Pool, url string) {
	t.Helper()
	// A connection the pool destroys counts as acquired until it is closed.
	devtest.Eventually(t, 15*time.Second, "no connection acquired", func() bool { return pool.Stat().AcquiredConns() == 0 })
	ctx := ctxT(t)
	conn := connect(t, url)
	devtest.Eventually(t, 15*time.Second, "no session in a transaction and no advisory lock", func() bool {
		var open, locks int
		err := conn.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL),
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')`).Scan(&open, &locks)
		return err == nil && open == 0 && locks == 0
	})
}

// wantRecovered checks the state after a failed append: no transaction left
// open, the missing streams not written, the next append written, and, when
// newConns >= 0, the connection rolled back and reused rather than replaced.
func wantRecovered(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, url string, newConns int64, missing []string, next eventstore.StreamAppend) {
	t.Helper()
	wantClean(t, pool, url)
	ctx := ctxT(t)
	for _, stream := range missing {
		if _, err := s.ReadStream(ctx, stream, 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("%s after the failed append: %v, want not found", stream, err)
		}
	}
	if _, err := s.AppendMulti(ctx, []eventstore.StreamAppend{next}); err != nil {
		t.Fatalf("append after the failed one: %v", err)
	}
	if n := pool.Stat().NewConnsCount(); newConns >= 0 && n != newConns {
		t.Fatalf("%d new connections: the failed append's connection was not rolled back for reuse", n-newConns)
	}
}

// TestAppendRoundTrips: once a connection has prepared its statements, an
// append that writes costs two round trips, whatever its number of streams.
func TestAppendRoundTrips(t *testing.T) {
	ctx := ctxT(t)
	var writes atomic.Int64
	s, _ := openPool(t, devtest.DatabaseURL(t), 1, &writes)
	appendParts := func(n int) {
		t.Helper()
		parts := make([]eventstore.StreamAppend, n)
		for i := range parts {
			parts[i] = part(fmt.Sprintf("rt-%d-%d-%d", n, i, writes.Load()), eventstore.NoStream, 1+i%2)
		}
		if _, err := s.AppendMulti(ctx, parts); err != nil {
			t.Fatal(err)
		}
	}
	appendParts(1) // the first appends prepare the statements
	appendParts(2)
	for _, n := range []int{1, 2, 32} {
		before := writes.Load()
		appendParts(n)
		if got := writes.Load() - before; got != 2 {
			t.Errorf("append of %d parts: %d round trips, want 2", n, got)
		}
	}
	// An idempotent re-append costs more (it reads the stream), but its common
	// part does not grow: it ends with COMMIT alone.
	p := part("rt-again", eventstore.NoStream, 2)
	if _, err := s.AppendMulti(ctx, []eventstore.StreamAppend{p}); err != nil {
		t.Fatal(err)
	}
	before := writes.Load()
	if res, err := s.AppendMulti(ctx, []eventstore.StreamAppend{p}); err != nil || !res[0].Idempotent {
		t.Fatalf("re-append: %+v, %v", res, err)
	}
	if got := writes.Load() - before; got > 4 {
		t.Errorf("idempotent re-append: %d round trips, want at most 4", got)
	}
}

// TestCommitAnsweredRollback: when the transaction is already aborted at COMMIT,
// the server answers ROLLBACK; that is an error, never a success, nothing is
// written, and the connection goes back to the pool idle.
func TestCommitAnsweredRollback(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, pool := openPool(t, url, 1, nil)
	x := part("x", eventstore.NoStream, 2)
	if _, err := s.AppendMulti(ctx, []eventstore.StreamAppend{x}); err != nil {
		t.Fatal(err)
	}
	newConns := pool.Stat().NewConnsCount()
	postgres.SetBeforeCommit(s, func(ctx context.Context, conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, "SELECT 1/0"); err == nil { // aborts the transaction
			t.Error("1/0 did not fail")
		}
	})

	// Nothing to insert: the second round trip is COMMIT alone, answered ROLLBACK.
	res, err := s.AppendMulti(ctx, []eventstore.StreamAppend{x})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("idempotent re-append in an aborted transaction: %+v, %v; want ErrTxCommitRollback", res, err)
	}
	// Something to insert: the INSERT fails, the COMMIT is skipped.
	y := part("y", eventstore.NoStream, 1)
	if res, err := s.AppendMulti(ctx, []eventstore.StreamAppend{y, part("x", eventstore.Exact(1), 1)}); err == nil {
		t.Fatalf("append in an aborted transaction succeeded: %+v", res)
	}
	postgres.SetBeforeCommit(s, nil)
	if got, err := s.ReadStream(ctx, "x", 0, eventstore.Forwards, 0); err != nil || len(got) != 2 {
		t.Fatalf("x after the failed appends: %d events, %v", len(got), err)
	}
	wantRecovered(t, s, pool, url, newConns, []string{"y"}, y)
}

// TestCommitFails: a COMMIT that fails (here a deferred constraint trigger) is the
// server's error; nothing is written and the connection is reused.
func TestCommitFails(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, pool := openPool(t, url, 1, nil)
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.type = 'Refused' THEN RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'P0001'; END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION refuse();`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "a", eventstore.NoStream, []eventstore.EventData{ev()}); err != nil {
		t.Fatal(err)
	}
	newConns := pool.Stat().NewConnsCount()
	refused := ev()
	refused.Type = "Refused"
	_, err := s.AppendMulti(ctx, []eventstore.StreamAppend{
		{Stream: "b", Expected: eventstore.NoStream, Events: []eventstore.EventData{ev(), refused}},
		part("a", eventstore.Exact(0), 1),
	})
	if err == nil || errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("append refused at commit: %v, want the server's error", err)
	}
	t.Log(err)
	wantRecovered(t, s, pool, url, newConns, []string{"b"}, part("a", eventstore.Exact(0), 1))
}

// TestInsertFailureRollsBack: an INSERT refused by the server (a known event ID)
// keeps its error mapping, and the aborted transaction is rolled back so that
// the connection is reused.
func TestInsertFailureRollsBack(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, pool := openPool(t, url, 1, nil)
	e := ev()
	if _, err := s.Append(ctx, "x", eventstore.NoStream, []eventstore.EventData{e}); err != nil {
		t.Fatal(err)
	}
	newConns := pool.Stat().NewConnsCount()
	_, err := s.AppendMulti(ctx, []eventstore.StreamAppend{part("z", eventstore.NoStream, 1), {Stream: "y", Expected: eventstore.NoStream, Events: []eventstore.EventData{e}}})
	if !errors.Is(err, postgres.ErrDuplicateEventID) {
		t.Fatalf("known ID in another stream: %v", err)
	}
	wantRecovered(t, s, pool, url, newConns, []string{"z"}, part("z", eventstore.NoStream, 1))
}

// TestCancelDuringAppend cancels appends at each of their stages. None leaves a
// transaction open on a pooled connection or a stream half-written, and the
// store goes on working.
func TestCancelDuringAppend(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, pool := openPool(t, url, 4, nil)
	r := &cancelRig{ctx: ctx, url: url, s: s, pool: pool, admin: connect(t, url)}
	t.Run("waiting for a lock", r.cancelWaitingForLock)
	t.Run("between the round trips", r.cancelBetweenRoundTrips)
	// Cancelled while the server runs the INSERT: the COMMIT is already on its
	// way, so the outcome is unknown (all or nothing); a retry with the same
	// event IDs settles it.
	t.Run("during the insert", r.cancelDuringInsert)
}

// cancelRig is TestCancelDuringAppend's store, its pool and an admin
// connection that watches the server.
type cancelRig struct {
	ctx   context.Context
	url   string
	s     *postgres.Store
	pool  *pgxpool.Pool
	admin *pgx.Conn
}

// appendOutcome is what an append started in the background returned.
type appendOutcome struct {
	res []eventstore.AppendResult
	err error
}

// waitFor waits until query, run on the admin connection, counts more than 0.
func (r *cancelRig) waitFor(t *testing.T, what, query string) {
	t.Helper()
	devtest.Eventually(t, 15*time.Second, what, func() bool {
		var n int
		err := r.admin.QueryRow(r.ctx, query).Scan(&n)
		return err == nil && n > 0
	})
}

// start runs an append in the background.
func (r *cancelRig) start(ctx context.Context, parts ...eventstore.StreamAppend) <-chan appendOutcome {
	done := make(chan appendOutcome, 1)
	go func() {
		res, err := r.s.AppendMulti(ctx, parts)
		done <- appendOutcome{res, err}
	}()
	return done
}

// wait waits (15s at the most) for a cancelled append to return.
func (r *cancelRig) wait(t *testing.T, done <-chan appendOutcome) appendOutcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(15 * time.Second):
		t.Fatal("the cancelled append did not return")
		return appendOutcome{}
	}
}

// cancelWaitingForLock cancels an append that waits for a stream's lock.
func (r *cancelRig) cancelWaitingForLock(t *testing.T) {
	held, err := r.s.AppendHeld(r.ctx, "held", eventstore.NoStream, []eventstore.EventData{ev()})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	done := r.start(cctx, part("other", eventstore.NoStream, 1), part("held", eventstore.Any, 2))
	r.waitFor(t, "the append to wait for the lock", "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
	cancel()
	if o := r.wait(t, done); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled while waiting for a lock: %+v, %v", o.res, o.err)
	}
	if err := held.Rollback(); err != nil {
		t.Fatal(err)
	}
	// The cancelled connection is closed (pgx ends it at the cancel): -1.
	wantRecovered(t, r.s, r.pool, r.url, -1, []string{"held", "other"}, part("after-cancel", eventstore.NoStream, 1))
}

// cancelBetweenRoundTrips cancels an append after its first round trip,
// before the commit.
func (r *cancelRig) cancelBetweenRoundTrips(t *testing.T) {
	newConns := r.pool.Stat().NewConnsCount()
	cctx, cancel := context.WithCancel(r.ctx)
	postgres.SetBeforeCommit(r.s, func(context.Context, *pgx.Conn) { cancel() })
	_, err := r.s.AppendMulti(cctx, []eventstore.StreamAppend{part("between", eventstore.NoStream, 2)})
	postgres.SetBeforeCommit(r.s, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before the second round trip: %v", err)
	}
	wantRecovered(t, r.s, r.pool, r.url, newConns, []string{"between"}, part("between", eventstore.NoStream, 1))
}

// cancelDuringInsert cancels an append while a trigger slows its INSERT: all
// or none of it is written, and a retry settles which.
func (r *cancelRig) cancelDuringInsert(t *testing.T) {
	ctx := r.ctx
	if _, err := r.admin.Exec(ctx, `
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.type = 'Slow' THEN PERFORM pg_sleep(0.5); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION slow();`); err != nil {
		t.Fatal(err)
	}
	slow := part("slow", eventstore.NoStream, 2)
	slow.Events[0].Type = "Slow"
	other := part("slow-other", eventstore.NoStream, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := r.start(cctx, slow, other)
	r.waitFor(t, "the insert to run", "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
	cancel()
	o := r.wait(t, done)
	if !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled during the insert: %+v, %v", o.res, o.err)
	}
	t.Log(o.err)
	wantClean(t, r.pool, r.url)
	var n int
	if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM events WHERE stream IN ('slow', 'slow-other')").Scan(&n); err != nil || (n != 0 && n != 3) {
		t.Fatalf("%d events of the cancelled append written (%v): want all or none", n, err)
	}
	t.Logf("%d of 3 events written", n)
	res, err := r.s.AppendMulti(ctx, []eventstore.StreamAppend{slow, other})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if res[0].Idempotent != (n == 3) || res[1].Idempotent != (n == 3) {
		t.Fatalf("retry after %d events written: %+v", n, res)
	}
	if got, err := r.s.ReadStream(ctx, "slow", 0, eventstore.Forwards, 0); err != nil || len(got) != 2 {
		t.Fatalf("slow after the retry: %d events, %v", len(got), err)
	}
}

// TestCrossedMultiAppends: appends that share some of their streams, each
// listing them in an order of its own, neither deadlock nor break "all": within
// a stream, transaction-id order is revision order.
func TestCrossedMultiAppends(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, _ := openPool(t, url, 8, nil)
	streams := []string{"c0", "c1", "c2", "c3", "c4"}
	const writers, rounds, width = 8, 25, 3
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				perm := rng.Perm(len(streams))[:width]
				parts := make([]eventstore.StreamAppend, width)
				for i, k := range perm {
					parts[i] = part(streams[k], eventstore.Any, 1)
				}
				if _, err := s.AppendMulti(ctx, parts); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("crossed multi appends: %v", err)
	}
	var all []eventstore.RecordedEvent
	var err error
	devtest.Eventually(t, 15*time.Second, "every event in all", func() bool {
		all, err = s.ReadAll(ctx, eventstore.Start, 0)
		return err == nil && len(all) == writers*rounds*width
	})
	next := map[string]uint64{}
	for _, e := range all {
		if e.Revision != next[e.Stream] {
			t.Fatalf("all has %s@%d after revision %d: xid order is not revision order", e.Stream, e.Revision, int64(next[e.Stream])-1)
		}
		next[e.Stream]++
	}
}

// TestLocksTakenInKeyOrder: a multi-stream append takes its streams' locks in
// the order of their keys, whatever the order of its parts. Another session
// holds the median key; the append, stopped there, must hold exactly the
// smaller keys.
func TestLocksTakenInKeyOrder(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s, _ := openPool(t, url, 2, nil)
	admin := connect(t, url)
	holder := connect(t, url)

	streams := make([]string, 9)
	for i := range streams {
		streams[i] = fmt.Sprintf("order-%d", i)
	}
	rows, _ := admin.Query(ctx, "SELECT hashtextextended(s, 0) FROM unnest($1::text[]) AS s ORDER BY 1", streams)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	median := keys[len(keys)/2]

	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", median); err != nil {
		t.Fatal(err)
	}
	parts := make([]eventstore.StreamAppend, len(streams))
	for i, k := range rand.Perm(len(streams)) {
		parts[i] = part(streams[k], eventstore.NoStream, 1)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.AppendMulti(ctx, parts)
		done <- err
	}()
	var pid int
	devtest.Eventually(t, 15*time.Second, "the append to wait for the median key", func() bool {
		err := admin.QueryRow(ctx, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&pid)
		return err == nil
	})
	rows, _ = admin.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND pid = $1 ORDER BY 1`, pid)
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	want := keys[:len(keys)/2]
	if fmt.Sprint(held) != fmt.Sprint(want) {
		t.Fatalf("waiting for key %d, the append holds %v; want the smaller keys %v", median, held, want)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the append did not finish")
	}
}
