package postgres_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/eventstore/storetest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

var _ storetest.HeldAppender = (*postgres.Store)(nil)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestConformance runs the suite with one store per subtest on one shared
// database: the suite is written for shared stores (a KurrentDB server), and
// sharing saves a CREATE DATABASE per subtest.
func TestConformance(t *testing.T) {
	url := devtest.DatabaseURL(t)
	storetest.Run(t, func(t *testing.T) eventstore.Store { return devtest.Store(t, url) })
}

func ev() eventstore.EventData {
	return eventstore.EventData{ID: uuid.New(), Type: "E", Data: []byte(`{}`), Metadata: []byte(`{}`)}
}

// TestNaiveReaderSkipsHeldTransaction shows the gap at the SQL level: A inserts
// first (smaller position) but commits after B. A reader of `ORDER BY position`
// that checkpoints at B never sees A; the store's reader holds B back until A has
// committed and then delivers A, B in order.
func TestNaiveReaderSkipsHeldTransaction(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s := devtest.Store(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	naive := func(after int64) ([]uuid.UUID, int64) { return readNaively(ctx, t, conn, after) }

	a, b := ev(), ev()
	heldA, err := s.AppendHeld(ctx, "a", eventstore.NoStream, []eventstore.EventData{a})
	if err != nil {
		t.Fatal(err)
	}
	defer heldA.Rollback()
	if _, err := s.Append(ctx, "b", eventstore.NoStream, []eventstore.EventData{b}); err != nil {
		t.Fatal(err)
	}

	seen, checkpoint := naive(0)
	if len(seen) != 1 || seen[0] != b.ID {
		t.Fatalf("naive reader saw %v before A committed, want just B", seen)
	}
	if got, err := s.ReadAll(ctx, eventstore.Start, 0); err != nil || len(got) != 0 {
		t.Fatalf("store reader before A committed: %d events, %v; want none (A's transaction is older than B's)", len(got), err)
	}
	if h, err := s.Head(ctx); err != nil || h != eventstore.Start {
		t.Fatalf("head before A committed: %s, %v", h, err)
	}

	if err := heldA.Commit(); err != nil {
		t.Fatal(err)
	}
	if seen, _ := naive(checkpoint); len(seen) != 0 {
		t.Fatalf("naive reader after its checkpoint: %v", seen)
	}
	var posA int64
	if err := conn.QueryRow(ctx, "SELECT position FROM events WHERE event_id = $1", a.ID).Scan(&posA); err != nil {
		t.Fatal(err)
	}
	if posA >= checkpoint {
		t.Fatalf("A at position %d, checkpoint %d: the gap did not happen", posA, checkpoint)
	}
	t.Logf("naive reader skipped A for good: A at position %d, below its checkpoint %d", posA, checkpoint)

	var got []eventstore.RecordedEvent
	devtest.Eventually(t, 15*time.Second, "A and B in all", func() bool {
		got, err = s.ReadAll(ctx, eventstore.Start, 0)
		return err == nil && len(got) == 2
	})
	if got[0].ID != a.ID || got[1].ID != b.ID || got[0].Position.Compare(got[1].Position) >= 0 {
		t.Fatalf("store reader: %s@%s, %s@%s; want A then B", got[0].ID, got[0].Position, got[1].ID, got[1].Position)
	}
	if got[0].Position.Prepare != uint64(posA) {
		t.Fatalf("A's position %s does not carry its row position %d", got[0].Position, posA)
	}
}

// readNaively is the naive reader of "all": the events after a row position,
// in position order, and the last position it saw (its checkpoint).
func readNaively(ctx context.Context, t *testing.T, conn *pgx.Conn, after int64) (ids []uuid.UUID, last int64) {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT position, event_id FROM events WHERE position > $1 ORDER BY position", after)
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	last = after
	if _, err := pgx.ForEachRow(rows, []any{&last, &id}, func() error { ids = append(ids, id); return nil }); err != nil {
		t.Fatal(err)
	}
	return ids, last
}

// TestXidAssignedAfterStreamLock: an append that waits for its stream's lock gets
// its transaction id only once it holds the lock, so "all" (xid order) keeps the
// stream's revision order. D waits behind held A on stream s while C commits on
// another stream: D's xid must be above C's (it would be below, were the xid
// taken before the wait).
func TestXidAssignedAfterStreamLock(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s := devtest.Store(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	heldA, err := s.AppendHeld(ctx, "s", eventstore.NoStream, []eventstore.EventData{ev()})
	if err != nil {
		t.Fatal(err)
	}
	defer heldA.Rollback()
	type result struct {
		res eventstore.AppendResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.Append(ctx, "s", eventstore.Exact(0), []eventstore.EventData{ev()})
		done <- result{res, err}
	}()
	devtest.Eventually(t, 15*time.Second, "D to wait for the stream lock", func() bool {
		var waiting int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&waiting)
		return err == nil && waiting == 1
	})
	resC, err := s.Append(ctx, "c", eventstore.NoStream, []eventstore.EventData{ev()})
	if err != nil {
		t.Fatal(err)
	}
	if err := heldA.Commit(); err != nil {
		t.Fatal(err)
	}
	var d result
	select {
	case d = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("D did not finish after A committed")
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	if d.res.Position.Commit <= resC.Position.Commit {
		t.Fatalf("D's xid %d is not above C's %d: taken before the stream lock", d.res.Position.Commit, resC.Position.Commit)
	}
	var all []eventstore.RecordedEvent
	devtest.Eventually(t, 15*time.Second, "three events in all", func() bool {
		all, err = s.ReadAll(ctx, eventstore.Start, 0)
		return err == nil && len(all) == 3
	})
	if all[0].Stream != "s" || all[0].Revision != 0 || all[2].Stream != "s" || all[2].Revision != 1 {
		t.Fatalf("all: %s@%d, %s@%d, %s@%d", all[0].Stream, all[0].Revision, all[1].Stream, all[1].Revision, all[2].Stream, all[2].Revision)
	}
}

func TestDuplicateEventIDInAnotherStream(t *testing.T) {
	ctx := ctxT(t)
	s := devtest.Postgres(t)
	e := ev()
	if _, err := s.Append(ctx, "x", eventstore.NoStream, []eventstore.EventData{e}); err != nil {
		t.Fatal(err)
	}
	for _, exp := range []eventstore.ExpectedRevision{eventstore.NoStream, eventstore.Any} {
		_, err := s.Append(ctx, "y", exp, []eventstore.EventData{e})
		if !errors.Is(err, postgres.ErrDuplicateEventID) || errors.Is(err, eventstore.ErrWrongExpectedRevision) {
			t.Fatalf("same ID in another stream at %s: %v, want ErrDuplicateEventID", exp, err)
		}
	}
	if _, err := s.Append(ctx, "z", eventstore.NoStream, []eventstore.EventData{ev(), e}); !errors.Is(err, postgres.ErrDuplicateEventID) {
		t.Fatalf("a batch containing a known ID: %v", err)
	}
	if _, err := s.ReadStream(ctx, "y", 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("y after the refused appends: %v", err)
	}
}

// TestUnavailable: a server that cannot be reached is ErrUnavailable.
func TestUnavailable(t *testing.T) {
	s := devtest.Postgres(t)
	s.Pool().Close() // every later use of the pool fails like a lost server
	_, err := s.Append(ctxT(t), "x", eventstore.NoStream, []eventstore.EventData{ev()})
	if !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("append on a closed pool: %v, want ErrUnavailable", err)
	}
	if _, err := s.ReadAll(ctxT(t), eventstore.Start, 1); !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("read all on a closed pool: %v, want ErrUnavailable", err)
	}

	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = postgres.Open(short, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if !errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("open on a closed port: %v, want ErrUnavailable", err)
	}
}

// TestXidOrderIsNumeric: "all" orders by the xid as a number. Two events whose
// xids straddle a power of ten (9xxx, 10000) would swap in a text order.
func TestXidOrderIsNumeric(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s := devtest.Store(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var next uint64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&next); err != nil {
		t.Fatal(err)
	}
	bound := uint64(10)
	for bound <= next+1 {
		bound *= 10
	}
	if bound-next > 50_000 {
		t.Skipf("next xid %d is too far from %d to burn through", next, bound)
	}
	// Burn xids (one committed transaction each) up to just below the bound.
	burn := func(until uint64) {
		t.Helper()
		if _, err := conn.Exec(ctx, `DO $$
			BEGIN
				WHILE pg_snapshot_xmax(pg_current_snapshot())::text::bigint < `+strconv.FormatUint(until, 10)+` LOOP
					PERFORM pg_current_xact_id();
					COMMIT;
				END LOOP;
			END $$`); err != nil {
			t.Fatal(err)
		}
	}
	burn(bound - 2)
	a, err := s.Append(ctx, "a", eventstore.NoStream, []eventstore.EventData{ev()})
	if err != nil {
		t.Fatal(err)
	}
	burn(bound)
	b, err := s.Append(ctx, "b", eventstore.NoStream, []eventstore.EventData{ev()})
	if err != nil {
		t.Fatal(err)
	}
	if len(strconv.FormatUint(a.Position.Commit, 10)) == len(strconv.FormatUint(b.Position.Commit, 10)) {
		t.Fatalf("xids %d and %d do not straddle %d", a.Position.Commit, b.Position.Commit, bound)
	}
	var all []eventstore.RecordedEvent
	devtest.Eventually(t, 15*time.Second, "both events in all", func() bool {
		all, err = s.ReadAll(ctx, eventstore.Start, 0)
		return err == nil && len(all) == 2
	})
	if all[0].Stream != "a" || all[1].Stream != "b" {
		t.Fatalf("all: %s@%s then %s@%s", all[0].Stream, all[0].Position, all[1].Stream, all[1].Position)
	}
	if rest, err := s.ReadAll(ctx, a.Position, 0); err != nil || len(rest) != 1 || rest[0].Stream != "b" {
		t.Fatalf("after A: %d events, %v", len(rest), err)
	}
	if h, err := s.Head(ctx); err != nil || h != b.Position {
		t.Fatalf("head %s, %v; want %s", h, err, b.Position)
	}
}

// TestSubscriptionRetriesTransientErrors: the server ends every connection of the
// store (as on a failover); the subscription reconnects and goes on.
func TestSubscriptionRetriesTransientErrors(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s := devtest.Store(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	sub, err := s.SubscribeAll(ctx, eventstore.Start, eventstore.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next := func(rev uint64) {
		t.Helper()
		select {
		case e, ok := <-sub.Events():
			if !ok || e.Revision != rev {
				t.Fatalf("got %v (open %v), want revision %d; err %v", e.Revision, ok, rev, sub.Err())
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("revision %d not delivered", rev)
		}
	}
	if _, err := s.Append(ctx, "x", eventstore.NoStream, []eventstore.EventData{ev()}); err != nil {
		t.Fatal(err)
	}
	next(0)
	var ended int
	if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended); err != nil || ended == 0 {
		t.Fatalf("terminated %d connections: %v", ended, err)
	}
	// The pool may hand out a dead connection once; the append is retried like a client would.
	devtest.Eventually(t, 15*time.Second, "an append after the connections were ended", func() bool {
		_, err := s.Append(ctx, "x", eventstore.Exact(0), []eventstore.EventData{ev()})
		if err != nil && !errors.Is(err, eventstore.ErrUnavailable) {
			t.Fatalf("append after termination: %v", err)
		}
		return err == nil
	})
	next(1)
}

// TestSubscriptionFailsOnPermanentError: a failure that retrying cannot cure ends
// the subscription with Err set.
func TestSubscriptionFailsOnPermanentError(t *testing.T) {
	ctx := ctxT(t)
	url := devtest.DatabaseURL(t)
	s := devtest.Store(t, url)
	sub, err := s.SubscribeAll(ctx, eventstore.Start, eventstore.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := s.Pool().Exec(ctx, "ALTER TABLE events RENAME TO events_gone"); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-sub.Events():
		if ok {
			t.Fatal("an event from an empty store")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("subscription still running on a missing table")
	}
	if err := sub.Err(); err == nil || errors.Is(err, eventstore.ErrUnavailable) {
		t.Fatalf("Err = %v, want a permanent error", err)
	}
}

// TestDuplicateIDsCountsRows: DuplicateIDs counts the rows of "all" in its
// range, in a table whose unique constraints were dropped, and names each ID
// stored more than once in the order of its first position.
func TestDuplicateIDsCountsRows(t *testing.T) {
	ctx := ctxT(t)
	s := devtest.Postgres(t)
	e1, e2, e3 := ev(), ev(), ev()
	if _, err := s.Append(ctx, "a", eventstore.NoStream, []eventstore.EventData{e1, e2, e3}); err != nil {
		t.Fatal(err)
	}
	originals, err := s.ReadAll(ctx, eventstore.Start, 0)
	if err != nil || len(originals) != 3 {
		t.Fatalf("read all: %d events, %v", len(originals), err)
	}
	if _, err := s.Pool().Exec(ctx, `ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_revision_key`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{e2.ID, e1.ID, e1.ID} { // each copy in a transaction of its own, after the originals
		if _, err := s.Pool().Exec(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
			SELECT stream, revision, event_id, type, data, metadata FROM events WHERE event_id = $1 LIMIT 1`, id); err != nil {
			t.Fatal(err)
		}
	}
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dups := func(after, until eventstore.Position) string {
		var got string
		err := s.DuplicateIDs(ctx, after, until, func(id string, times int64) error {
			got += id + "x" + strconv.FormatInt(times, 10) + " "
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := dups(eventstore.Start, head), e1.ID.String()+"x3 "+e2.ID.String()+"x2 "; got != want {
		t.Errorf("the whole of all: %q, want %q", got, want)
	}
	if got := dups(eventstore.Start, originals[2].Position); got != "" {
		t.Errorf("up to the originals: %q, want none", got)
	}
	if got, want := dups(originals[2].Position, head), e1.ID.String()+"x2 "; got != want {
		t.Errorf("after the originals (their copies): %q, want %q", got, want)
	}
}

// TestDuplicateIDsTrustsOnlyAWholeUniqueIndex: DuplicateIDs answers from the
// table's unique index on event_id alone when that index holds every row of
// "all" to one ID (as migration 00001 made it); each way of planting an ID
// twice behind a unique index that does not (one that leaves rows out, one
// over more columns, a child table beside it, an index not unique, a
// deferrable constraint whose check at commit was skipped, a text column
// whose collation makes IDs equal that its index holds apart) is counted and
// found.
func TestDuplicateIDsTrustsOnlyAWholeUniqueIndex(t *testing.T) {
	const dropped = `ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_revision_key;`
	const copyOf = `SELECT stream, revision, event_id, type, data, metadata FROM events WHERE event_id = $1 LIMIT 1`
	const copyToB = `INSERT INTO events (stream, revision, event_id, type, data, metadata) SELECT 'b', revision, event_id, type, data, metadata FROM events WHERE event_id = $1 LIMIT 1`
	for _, c := range []struct {
		name        string
		before, dup string // SQL run before the copy of the event's row, the copy ($1 its ID)
		after       string // SQL run after it
	}{
		{"a partial unique index leaving the copy out", dropped, `INSERT INTO events (stream, revision, event_id, type, data, metadata) ` + copyOf,
			`CREATE UNIQUE INDEX events_some_ids ON events (event_id) WHERE revision > 0 OR stream <> 'a'`},
		{"a unique index over the ID and the stream", dropped + `CREATE UNIQUE INDEX events_id_stream ON events (event_id, stream)`,
			`INSERT INTO events (stream, revision, event_id, type, data, metadata) SELECT 'b', revision, event_id, type, data, metadata FROM events WHERE event_id = $1 LIMIT 1`, ``},
		{"a child table holding the copy, the constraint whole", `CREATE TABLE events_child () INHERITS (events)`,
			`INSERT INTO events_child (position, stream, revision, event_id, type, data, metadata) SELECT position + 1000, 'c', revision, event_id, type, data, metadata FROM events WHERE event_id = $1 LIMIT 1`, ``},
		{"an index on the ID that is not unique", dropped + `CREATE INDEX events_ids ON events (event_id)`, copyToB, ``},
		{"a deferrable constraint whose check at commit was skipped (its triggers disabled)",
			`ALTER TABLE events DROP CONSTRAINT events_event_id_key, ADD CONSTRAINT events_event_id_key UNIQUE (event_id) DEFERRABLE INITIALLY DEFERRED;
			ALTER TABLE events DISABLE TRIGGER ALL`, copyToB, `ALTER TABLE events ENABLE TRIGGER ALL`},
		{"a text column of a case-blind collation, its unique index in collation C",
			`CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
			ALTER TABLE events DROP CONSTRAINT events_event_id_key;
			ALTER TABLE events ALTER COLUMN event_id TYPE text COLLATE case_blind;
			CREATE UNIQUE INDEX events_event_id_c ON events (event_id COLLATE "C")`,
			`INSERT INTO events (stream, revision, event_id, type, data, metadata) SELECT 'b', revision, upper(event_id), type, data, metadata FROM events WHERE event_id = $1::text LIMIT 1`, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := devtest.Postgres(t)
			e := ev()
			if _, err := s.Append(ctx, "a", eventstore.NoStream, []eventstore.EventData{e, ev()}); err != nil {
				t.Fatal(err)
			}
			if got := idsUniqueByIndex(ctx, t, s); !got {
				t.Fatal("the store as migrated: not trusted, want trusted")
			}
			for _, sql := range []string{c.before, c.dup, c.after} {
				args := []any{}
				if sql == c.dup {
					args = append(args, e.ID)
				}
				if _, err := s.Pool().Exec(ctx, sql, args...); sql != "" && err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			if idsUniqueByIndex(ctx, t, s) {
				t.Error("trusted, want counted")
			}
			var got string
			err := s.DuplicateIDs(ctx, eventstore.Start, eventstore.Position{Commit: math.MaxUint64, Prepare: math.MaxUint64}, func(id string, times int64) error {
				got += strings.ToLower(id) + "x" + strconv.FormatInt(times, 10) + " "
				return nil
			})
			if want := e.ID.String() + "x2 "; err != nil || got != want {
				t.Errorf("DuplicateIDs: %q, %v; want %q", got, err, want)
			}
		})
	}
}

// idsUniqueByIndex runs the query by which s trusts its unique index.
func idsUniqueByIndex(ctx context.Context, t *testing.T, s *postgres.Store) bool {
	t.Helper()
	var unique bool
	if err := s.Pool().QueryRow(ctx, postgres.IDsUniqueByIndex).Scan(&unique); err != nil {
		t.Fatal(err)
	}
	return unique
}

// TestReadAllPageRoomFollowsTheLastPage: a read of "all" makes room for as
// many events as the last one returned, up to its limit: a full page after a
// full page is one slice of the page's size (not doubled up to it), and a
// read after an empty one makes no room ahead of its rows.
func TestReadAllPageRoomFollowsTheLastPage(t *testing.T) {
	ctx := ctxT(t)
	s := devtest.Store(t, devtest.DatabaseURL(t))
	const page = 100
	for i := range 3 * page {
		if _, err := s.Append(ctx, "s-"+strconv.Itoa(i), eventstore.NoStream, []eventstore.EventData{ev()}); err != nil {
			t.Fatal(err)
		}
	}
	after := eventstore.Start
	for i := range 3 {
		got, err := s.ReadAll(ctx, after, page)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != page {
			t.Fatalf("page %d: %d events, want %d", i, len(got), page)
		}
		if i > 0 && cap(got) != page {
			t.Fatalf("page %d after a full one: room for %d events, want %d", i, cap(got), page)
		}
		after = got[len(got)-1].Position
	}
	if got, err := s.ReadAll(ctx, after, page); err != nil || len(got) != 0 {
		t.Fatalf("after the last: %d events, %v", len(got), err)
	}
	if _, err := s.Append(ctx, "s-last", eventstore.NoStream, []eventstore.EventData{ev()}); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadAll(ctx, after, page)
	if err != nil || len(got) != 1 {
		t.Fatalf("after an empty read: %d events, %v; want 1", len(got), err)
	}
	if cap(got) >= page {
		t.Fatalf("one event after an empty read: room for %d, want fewer than %d", cap(got), page)
	}
}

// TestReadAllPageRoomIsEachLimitsOwn: one Store serves several readers of
// "all" at once, each with a limit of its own (a node's projector runner,
// publisher, process subscription): a catching-up reader's full pages are
// each one slice of their size though a caught-up reader polls in between,
// and those empty polls make no room for the other's page (a review's case:
// one hint for the whole Store failed both).
func TestReadAllPageRoomIsEachLimitsOwn(t *testing.T) {
	ctx := ctxT(t)
	s := devtest.Store(t, devtest.DatabaseURL(t))
	const page, poll = 100, 30
	for i := range 3 * page {
		if _, err := s.Append(ctx, "s-"+strconv.Itoa(i), eventstore.NoStream, []eventstore.EventData{ev()}); err != nil {
			t.Fatal(err)
		}
	}
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := eventstore.Start
	for i := range 3 {
		got, err := s.ReadAll(ctx, after, page)
		if err != nil || len(got) != page {
			t.Fatalf("page %d: %d events, %v", i, len(got), err)
		}
		if i > 0 && cap(got) != page {
			t.Errorf("page %d after a full one of its limit, an empty poll between: room for %d events, want %d", i, cap(got), page)
		}
		after = got[len(got)-1].Position
		polled, err := s.ReadAll(ctx, head, poll)
		if err != nil || len(polled) != 0 {
			t.Fatalf("poll %d: %d events, %v", i, len(polled), err)
		}
		if i > 0 && cap(polled) != 0 {
			t.Errorf("empty poll %d after an empty one of its limit: room for %d events, want none", i, cap(polled))
		}
	}
}
