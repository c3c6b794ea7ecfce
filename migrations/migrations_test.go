package migrations_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestUpConcurrent runs Up from several sessions at once (as several processes
// would), then again: every call succeeds and each migration is applied once.
func TestUpConcurrent(t *testing.T) {
	url := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Up(ctx, url)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Up #%d: %v", i, err)
		}
	}
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatalf("Up again: %v", err)
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var applied, distinct int
	if err := conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0").Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied == 0 || applied != distinct {
		t.Fatalf("goose_db_version: %d applications of %d versions", applied, distinct)
	}
	var events bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('events') IS NOT NULL").Scan(&events); err != nil || !events {
		t.Fatalf("events table missing (%v)", err)
	}
	// data is bytea: exact bytes survive (jsonb would re-order keys and drop spaces).
	raw := []byte(`{"b": 1,  "a":2}`)
	var back []byte
	err = conn.QueryRow(ctx, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		VALUES ('s', 0, gen_random_uuid(), 't', $1, '') RETURNING data`, raw).Scan(&back)
	if err != nil || string(back) != string(raw) {
		t.Fatalf("data round trip: %q, %v", back, err)
	}
}

func TestUpCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := migrations.Up(ctx, pgtest.URL(t)); err == nil {
		t.Fatal("Up with a cancelled context succeeded")
	}
}
