package migrations_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

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

// TestDownLeavesNoAuditCheckpointAnEarlierBuildMisreads: migrating down past
// 00018 removes the checkpoints stored with its active holds' digest, past
// 00014 those stored with its digests, and past 00013 those
// whose accounts are in rows of their own (an earlier build would read either
// as a ledger without accounts, or without its digests' checks); a
// checkpoint of an earlier format stays.
func TestDownLeavesNoAuditCheckpointAnEarlierBuildMisreads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.URL(t)
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, accounts_digest, state_digest)
		VALUES (1, 1, 1, 'before 00013', NULL, NULL), (2, 2, 2, 'of 00013', 0, NULL), (3, 3, 3, 'of 00014', 0, md5('of 00014'))`)
	if err == nil {
		_, err = db.ExecContext(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, accounts_digest, state_digest, active_holds_digest)
			VALUES (4, 4, 4, 'of 00018', 0, md5('of 00018'), 0)`)
	}
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS(), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		to   int64
		kept string
	}{{17, "before 00013,of 00013,of 00014"}, {13, "before 00013,of 00013"}, {12, "before 00013"}} {
		if _, err := p.DownTo(ctx, c.to); err != nil {
			t.Fatal(err)
		}
		var kept string
		if err := db.QueryRowContext(ctx, `SELECT coalesce(string_agg(convert_from(state, 'UTF8'), ',' ORDER BY id), '') FROM readmodel.audit_checkpoints`).Scan(&kept); err != nil || kept != c.kept {
			t.Fatalf("down to %d: checkpoints kept %q (%v), want %q", c.to, kept, err, c.kept)
		}
	}
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
