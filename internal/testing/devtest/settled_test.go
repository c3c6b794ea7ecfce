package devtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSettledAllSeesPastTheHorizon: while a transaction that took its ID
// before an append runs, PostgreSQL's "all" hides the append, so ReadAll
// misses it (a conflict check that counted with it once found the last event
// of its set-up "written by the conflicts"); SettledAll waits for that
// transaction to end and shows the append, on the store and through
// WithoutMultiAppend.
func TestSettledAllSeesPastTheHorizon(t *testing.T) {
	ctx := context.Background()
	url := DatabaseURL(t)
	pg := Store(t, url)
	for i, st := range []eventstore.Store{pg, WithoutMultiAppend(pg)} {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		older, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := older.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
			t.Fatal(err)
		}
		e := eventstore.EventData{ID: uuid.New(), Type: "E", Data: []byte(`{}`), Metadata: []byte(`{}`)}
		if _, err := st.Append(ctx, "s", eventstore.Any, []eventstore.EventData{e}); err != nil {
			t.Fatal(err)
		}
		if n := len(ReadAll(t, st)); n != i {
			t.Fatalf("ReadAll shows %d events while an older transaction runs, want %d: the horizon this test stands on is gone", n, i)
		}
		ended := make(chan error, 1)
		go func() { ended <- commitOnceSettling(ctx, url, older) }()
		all := SettledAll(t, st)
		err = <-ended
		if len(all) != i+1 || all[i].ID != e.ID {
			t.Fatalf("SettledAll: %+v, want the %d events appended", all, i+1)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// commitOnceSettling commits tx once SettledAll polls (so it began while tx
// ran), polling for at most a minute.
func commitOnceSettling(ctx context.Context, url string, tx pgx.Tx) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, settledQuery).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return tx.Commit(ctx)
		}
	}
	_ = tx.Rollback(ctx)
	return errors.New("SettledAll did not poll within a minute")
}
