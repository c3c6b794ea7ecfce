package postgres_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/migrations"
)

// freeze stops every process of the pair's standby (SIGSTOP), so that a
// commit on the primary waits for it; the returned thaw (also run when t
// ends) lets it go on.
func freeze(t *testing.T, pair *pgcluster.Pair) (thaw func()) {
	t.Helper()
	standby := pair.Standby()
	if _, err := standby.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thaw = func() {
		if _, err := standby.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(thaw)
	return thaw
}

// syncWaiter is the PID of the one backend waiting for the synchronous
// standby, once there is one.
func syncWaiter(t *testing.T, admin *pgx.Conn) int {
	t.Helper()
	var pid int
	devtest.Eventually(t, 30*time.Second, "a commit waiting for the standby", func() bool {
		return admin.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&pid) == nil
	})
	return pid
}

func wantNoWaiter(t *testing.T, admin *pgx.Conn) {
	t.Helper()
	devtest.Eventually(t, 30*time.Second, "no commit waiting for the standby", func() bool {
		var n int
		return admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n) == nil && n == 0
	})
}

// TestCancelledWaitForTheStandbyIsIndefinite: with the standby frozen, a
// commit waits for it; when that wait is cancelled (pg_cancel_backend)
// PostgreSQL commits on the primary alone and answers COMMIT with a warning. Every commit path of the store (an append of one
// stream, of several, a held append's commit) must then return an
// indefinite error (ErrUnavailable, ErrNotReplicated), never a success; the
// same append sent again once the standby is back is answered from the
// stored events (idempotent), written once. A client whose own context ends
// the wait gets an error too (pgx drops the connection: outcome unknown). Fails on a store that takes the
// warning for success.
func TestCancelledWaitForTheStandbyIsIndefinite(t *testing.T) {
	if testing.Short() {
		t.Skip("PostgreSQL pair")
	}
	pair := devtest.Pair(t, "syncrep")
	ctx := context.Background()
	if err := migrations.Up(ctx, pair.URL()); err != nil {
		t.Fatal(err)
	}
	s := devtest.Store(t, pair.URL())
	admin := connect(t, pair.URL())
	cancel := func(t *testing.T) {
		pid := syncWaiter(t, admin)
		var ok bool
		if err := admin.QueryRow(ctx, `SELECT pg_cancel_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Errorf("pg_cancel_backend(%d): %v %v", pid, ok, err)
		}
	}
	held := func(ctx context.Context, s *postgres.Store, parts []eventstore.StreamAppend) error {
		held, err := s.AppendHeld(ctx, parts[0].Stream, parts[0].Expected, parts[0].Events)
		if err != nil {
			return err
		}
		return held.Commit()
	}
	multi := func(ctx context.Context, s *postgres.Store, parts []eventstore.StreamAppend) error {
		_, err := s.AppendMulti(ctx, parts)
		return err
	}
	for _, tc := range []struct {
		name    string
		store   *postgres.Store
		streams int
		append  func(context.Context, *postgres.Store, []eventstore.StreamAppend) error
		cancel  func(t *testing.T) // ends the wait
		client  bool               // the client's context ends the wait
		want    []error            // what the error must be
	}{
		{name: "pg_cancel_backend, one stream", store: s, streams: 1, append: multi, cancel: cancel, want: []error{eventstore.ErrUnavailable, postgres.ErrNotReplicated}},
		{name: "pg_cancel_backend, three streams", store: s, streams: 3, append: multi, cancel: cancel, want: []error{eventstore.ErrUnavailable, postgres.ErrNotReplicated}},
		{name: "pg_cancel_backend, held append", store: s, streams: 1, append: held, cancel: cancel, want: []error{eventstore.ErrUnavailable, postgres.ErrNotReplicated}},
		{name: "client context", store: s, streams: 1, append: multi, client: true, want: []error{context.Canceled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := make([]eventstore.StreamAppend, tc.streams)
			for i := range parts {
				parts[i] = part(t.Name()+string(rune('a'+i)), eventstore.NoStream, 2)
			}
			wantNoWaiter(t, admin) // the last case's commit is through
			thaw := freeze(t, pair)
			actx, stop := context.WithTimeout(ctx, time.Minute)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- tc.append(actx, tc.store, parts) }()
			switch {
			case tc.cancel != nil:
				tc.cancel(t)
			case tc.client:
				syncWaiter(t, admin)
				stop()
			}
			err := <-done
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Fatalf("append whose wait for the standby ended: %v, want %v", err, want)
				}
			}
			t.Logf("indefinite, as it must be: %v", err)
			// The commit is on the primary: the append again by its IDs finds it.
			thaw()
			res, err := s.AppendMulti(ctxT(t), parts)
			if err != nil {
				t.Fatalf("the same append again: %v", err)
			}
			for i, r := range res {
				if !r.Idempotent || r.FirstRevision != 0 || r.LastRevision != 1 {
					t.Errorf("%s again: %+v, want the original write (revisions 0-1, idempotent)", parts[i].Stream, r)
				}
				if evs := devtest.StreamEvents(t, s, parts[i].Stream); len(evs) != 2 {
					t.Errorf("%s holds %d events, want 2", parts[i].Stream, len(evs))
				}
			}
		})
	}
	// What a reader saw is made durable by Durable: its own commit waits for
	// the standby, and a cancelled wait is indefinite too.
	t.Run("Durable", func(t *testing.T) {
		wantNoWaiter(t, admin)
		thaw := freeze(t, pair)
		done := make(chan error, 1)
		go func() { done <- s.Durable(ctx) }()
		cancel(t)
		if err := <-done; !errors.Is(err, eventstore.ErrUnavailable) || !errors.Is(err, postgres.ErrNotReplicated) {
			t.Fatalf("Durable whose wait for the standby was cancelled: %v, want ErrNotReplicated", err)
		}
		thaw()
		if err := s.Durable(ctxT(t)); err != nil {
			t.Fatalf("Durable with the standby back: %v", err)
		}
	})
}

// TestAppendOnAnUnwatchedPoolIsRefused: a Store on a pool whose connections
// do not watch for the warning (one given to New, or OpenReader's) refuses to
// append, and writes nothing.
func TestAppendOnAnUnwatchedPoolIsRefused(t *testing.T) {
	url := devtest.DatabaseURL(t)
	pool, err := pgxpool.New(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	s := postgres.New(pool)
	t.Cleanup(func() { s.Close(); pool.Close() })
	reader, err := postgres.OpenReader(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	for name, s := range map[string]*postgres.Store{"New": s, "OpenReader": reader} {
		p := part("unwatched-"+name, eventstore.NoStream, 1)
		if _, err := s.AppendMulti(ctxT(t), []eventstore.StreamAppend{p}); err == nil || !strings.Contains(err.Error(), "WatchSyncReplication") {
			t.Fatalf("%s: append on an unwatched pool: %v, want refused naming WatchSyncReplication", name, err)
		}
		if _, err := s.ReadStream(ctxT(t), p.Stream, 0, eventstore.Forwards, 0); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("%s: the refused append wrote: %v", name, err)
		}
	}
}
