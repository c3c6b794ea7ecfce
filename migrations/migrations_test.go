package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
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

// TestDownLeavesNoAuditCheckpointAnEarlierBuildMisreads: from 00018 (pinned
// to it, its rows shaped as of it), migrating down past 00018 removes the
// checkpoints stored with its active holds' digest, past 00014 those stored
// with its digests, and past 00013 those whose accounts are in rows of their own (an earlier build would read either
// as a ledger without accounts, or without its digests' checks); a
// checkpoint of an earlier format stays.
func TestDownLeavesNoAuditCheckpointAnEarlierBuildMisreads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.URL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 18); err != nil { // its rows shaped as of 00018, whatever comes later
		t.Fatal(err)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, accounts_digest, state_digest)
		VALUES (1, 1, 1, 'before 00013', NULL, NULL), (2, 2, 2, 'of 00013', 0, NULL), (3, 3, 3, 'of 00014', 0, md5('of 00014'))`)
	if err == nil {
		_, err = db.ExecContext(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, accounts_digest, state_digest, active_holds_digest)
			VALUES (4, 4, 4, 'of 00018', 0, md5('of 00018'), 0)`)
	}
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

// TestActiveHoldsDigestFailsFastBehindALongReader (migration 00018): a
// transaction reading the audit checkpoints (an audit's) and left open makes
// 00018 fail once lock_timeout is over, saying what to do, and leaves the
// database at 00017, rather than queueing every reader of the table behind it.
func TestActiveHoldsDigestFailsFastBehindALongReader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	upTo(t, ctx, u, 17)
	conn := connect(t, ctx, u)
	reader, err := connect(t, ctx, u).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM readmodel.audit_checkpoints`); err != nil {
		t.Fatal(err)
	}
	uctx, ucancel := context.WithTimeout(ctx, 40*time.Second) // without lock_timeout it waits for the reader as long as asked
	defer ucancel()
	err = migrations.Up(uctx, u)
	if err == nil || !strings.Contains(err.Error(), "migration 00018 waited more than lock_timeout") || !strings.Contains(err.Error(), "stop audits") {
		t.Fatalf("00018 behind an open reader of readmodel.audit_checkpoints: %v, want waited more than lock_timeout ... stop audits", err)
	}
	var version int64
	if err := conn.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil || version != 17 {
		t.Fatalf("after the failed 00018: version %d (%v), want 17", version, err)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("00018 once the reader is gone: %v", err)
	}
}

// TestSnapshotsListedAtDown (migration 00022): migrating down past 00022
// gives each checkpoint that has it its snapshots' listing time as taken_at,
// which the build before 00022 reads as that time, not the save's.
func TestSnapshotsListedAtDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 22); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_listed_at)
		VALUES (1, 1, 1, 'listed', '2026-11-28 03:00:00+00'), (2, 2, 2, 'unlisted', NULL)`)
	if _, err := p.DownTo(ctx, 20); err != nil {
		t.Fatal(err)
	}
	var taken string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8') || '=' || (taken_at = '2026-11-28 03:00:00+00')::text, ',' ORDER BY id) FROM readmodel.audit_checkpoints`).Scan(&taken); err != nil || taken != "listed=true,unlisted=false" {
		t.Fatalf("down to 20: %q (%v), want the listed checkpoint's taken_at its listing time", taken, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestSnapshotRecordUpDown (migration 00023): going up, a checkpoint of the
// clock rule loses its snapshots_listed_at and has no record (refused by
// LoadAudit, projections' TestAuditCheckpointSnapshotRecord); going down
// past 00023, the checkpoints with a record go (the build before would
// refuse them) and the others stay, without a listing time.
func TestSnapshotRecordUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 22); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_listed_at)
		VALUES (1, 1, 1, 'clock', '2026-11-28 03:00:00+00')`)
	if _, err := p.UpTo(ctx, 23); err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_recorded)
		VALUES (2, 2, 2, 'recorded', true)`)
	var up string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8') || '=' || coalesce(snapshots_recorded::text, 'null'), ',' ORDER BY id) FROM readmodel.audit_checkpoints`).Scan(&up); err != nil || up != "clock=null,recorded=true" {
		t.Fatalf("up to 23: %q (%v), want the clock rule's checkpoint without a record", up, err)
	}
	if _, err := p.DownTo(ctx, 22); err != nil {
		t.Fatal(err)
	}
	var down string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8') || '=' || coalesce(snapshots_listed_at::text, 'null'), ',' ORDER BY id) FROM readmodel.audit_checkpoints`).Scan(&down); err != nil || down != "clock=null" {
		t.Fatalf("down to 22: %q (%v), want the recorded checkpoint gone", down, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestSnapshotDigestUpDown (migration 00024): going up, a checkpoint row's
// recorded snapshot bytes become their sha256, and the row's digest (00017's
// form, which took sha256 of the bytes) is what it was, so the checkpoint
// stands; going down past 00024, the checkpoints that record a snapshot go
// (the build before would take their rows for edited) and the others stay.
func TestSnapshotDigestUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 23); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	var ids [2]int64
	for i, state := range []string{"recording", "none recorded"} {
		if err := conn.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_recorded)
			VALUES (1, 1, 1, $1, true) RETURNING id`, state).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoint_accounts (checkpoint_id, account_id, next, chain, group_key, group_next, group_count, guarded, snapshot, snapshot_revision, snapshot_data)
		VALUES ($1, 'a', 9, 'c', '', 0, 0, false, 'state a', 5, 'snapshot of a at 5'), ($1, 'b', 3, 'c', '', 0, 0, false, 'state b', NULL, NULL),
			($2, 'b', 3, 'c', '', 0, 0, false, 'state b', NULL, NULL)`, ids[0], ids[1])
	digest := func(sum string) string {
		var d string
		if err := conn.QueryRow(ctx, `SELECT encode(sha256(string_agg(h, ''::bytea ORDER BY h)), 'hex') FROM (
			SELECT sha256(convert_to(row(account_id, next, chain, group_key, group_next, group_count, guarded, sha256(snapshot), snapshot_revision, `+sum+`)::text, 'UTF8')) AS h
			FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1) r`, ids[0]).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	before := digest("sha256(snapshot_data)")
	if _, err := p.UpTo(ctx, 24); err != nil {
		t.Fatal(err)
	}
	if after := digest("snapshot_sha256"); after != before {
		t.Fatalf("up to 24: the rows' digest %s, was %s", after, before)
	}
	var recorded bool
	if err := conn.QueryRow(ctx, `SELECT snapshot_sha256 = sha256('snapshot of a at 5') FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1 AND account_id = 'a'`, ids[0]).Scan(&recorded); err != nil || !recorded {
		t.Fatalf("up to 24: the record of a is not the sha256 of its bytes (%v)", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE readmodel.audit_checkpoint_accounts SET snapshot_sha256 = 'short' WHERE checkpoint_id = $1 AND account_id = 'a'`, ids[0]); err == nil {
		t.Fatal("up to 24: a record that is no sha256 was stored")
	}
	if _, err := p.DownTo(ctx, 23); err != nil {
		t.Fatal(err)
	}
	var kept string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8'), ',' ORDER BY id) FROM readmodel.audit_checkpoints`).Scan(&kept); err != nil || kept != "none recorded" {
		t.Fatalf("down to 23: %q (%v), want the recording checkpoint gone", kept, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestLoadWithoutAutovacuumUpDown (migration 00025): drop_secondary_indexes
// turns autovacuum off on a generation's tables and create_secondary_indexes
// analyzes them and turns it on again; going down, a generation being built
// gets autovacuum back, and the functions are the earlier ones again.
func TestLoadWithoutAutovacuumUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 25); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	options := func() string {
		var o string
		if err := conn.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ' '), '') FROM pg_class WHERE oid = 'readmodel.balance_history_g900'::regclass`).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	mustExec(t, ctx, conn, `SELECT readmodel.create_generation('balances', 900), readmodel.drop_secondary_indexes('balances', 900)`)
	if o := options(); o != "autovacuum_enabled=false" {
		t.Fatalf("a generation being loaded has options %q", o)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.create_secondary_indexes('balances', 900)`)
	var analyzed bool
	if err := conn.QueryRow(ctx, `SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relid = 'readmodel.balance_history_g900'::regclass`).Scan(&analyzed); err != nil || !analyzed || options() != "" {
		t.Fatalf("after its indexes: analyzed %v, options %q (%v)", analyzed, options(), err)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.checkpoints (name, generation, state) VALUES ('balances', 900, 'building')`)
	if _, err := p.DownTo(ctx, 24); err != nil {
		t.Fatal(err)
	}
	if o := options(); o != "" {
		t.Fatalf("down to 24: a generation being built has options %q", o)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.drop_secondary_indexes('balances', 900)`)
	if o := options(); o != "" {
		t.Fatalf("down to 24: drop_secondary_indexes set options %q", o)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestRefundsTotalUpDown (migration 00026): going up, the rows stored before
// keep no total (NULL) and a negative one is refused; going down past
// 00026, the checkpoints with a row carrying a total go (the build before
// would take their rows for edited) and the others stay.
func TestRefundsTotalUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 25); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	var ids [2]int64
	for i, state := range []string{"with a total", "without"} {
		if err := conn.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_recorded)
			VALUES (1, 1, 1, $1, true) RETURNING id`, state).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoint_accounts (checkpoint_id, account_id, next, chain, group_key, group_next, group_count, guarded, snapshot)
		VALUES ($1, 'a', 9, 'c', '', 0, 0, false, 'state a'), ($2, 'a', 9, 'c', '', 0, 0, false, 'state a')`, ids[0], ids[1])
	if _, err := p.UpTo(ctx, 26); err != nil {
		t.Fatal(err)
	}
	var totals int
	if err := conn.QueryRow(ctx, `SELECT count(refunds_total) FROM readmodel.audit_checkpoint_accounts`).Scan(&totals); err != nil || totals != 0 {
		t.Fatalf("up to 26: %d rows with a total (%v), want none", totals, err)
	}
	if _, err := conn.Exec(ctx, `UPDATE readmodel.audit_checkpoint_accounts SET refunds_total = -1 WHERE checkpoint_id = $1`, ids[0]); err == nil {
		t.Fatal("up to 26: a negative total was stored")
	}
	mustExec(t, ctx, conn, `UPDATE readmodel.audit_checkpoint_accounts SET refunds_total = 150 WHERE checkpoint_id = $1`, ids[0])
	if _, err := p.DownTo(ctx, 25); err != nil {
		t.Fatal(err)
	}
	var kept string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8'), ',' ORDER BY id) FROM readmodel.audit_checkpoints`).Scan(&kept); err != nil || kept != "without" {
		t.Fatalf("down to 25: %q (%v), want the checkpoint with a total gone", kept, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestAuditStopPointUpDown (migration 00028): the rows before it are
// checkpoints; a stop point needs its sets, named as an audit names them,
// and there is at most one; down to 27 drops the stop point and its sets'
// schema (the build before would read it as a checkpoint), keeping the
// checkpoints.
func TestAuditStopPointUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 27); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_recorded) VALUES (1, 1, 1, 'before', true)`)
	if _, err := p.UpTo(ctx, 28); err != nil {
		t.Fatal(err)
	}
	var kind string
	if err := conn.QueryRow(ctx, `SELECT kind FROM readmodel.audit_checkpoints`).Scan(&kind); err != nil || kind != "checkpoint" {
		t.Fatalf("up to 28: the row before is a %q (%v), want a checkpoint", kind, err)
	}
	const sets = "audit_sets_0123456789abcdef"
	for _, bad := range []string{
		`INSERT INTO readmodel.audit_checkpoints (kind, commit_position, prepare_position, events, state) VALUES ('stop', 2, 2, 2, 'no sets')`,
		`INSERT INTO readmodel.audit_checkpoints (kind, sets, commit_position, prepare_position, events, state) VALUES ('stop', 'public', 2, 2, 2, 'sets of another name')`,
		`INSERT INTO readmodel.audit_checkpoints (sets, commit_position, prepare_position, events, state) VALUES ('` + sets + `', 2, 2, 2, 'a checkpoint with sets')`,
		`INSERT INTO readmodel.audit_checkpoints (kind, commit_position, prepare_position, events, state) VALUES ('other', 2, 2, 2, 'another kind')`,
	} {
		if _, err := conn.Exec(ctx, bad); err == nil {
			t.Fatalf("up to 28: stored: %s", bad)
		}
	}
	mustExec(t, ctx, conn, `CREATE SCHEMA `+sets+`; CREATE UNLOGGED TABLE `+sets+`.audit_ids (event_id uuid)`)
	stop := `INSERT INTO readmodel.audit_checkpoints (kind, sets, commit_position, prepare_position, events, state) VALUES ('stop', '` + sets + `', 2, 2, 2, 'stop')`
	mustExec(t, ctx, conn, stop)
	if _, err := conn.Exec(ctx, stop); err == nil {
		t.Fatal("up to 28: a second stop point stored")
	}
	if _, err := p.DownTo(ctx, 27); err != nil {
		t.Fatal(err)
	}
	var kept string
	var schemas int
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8'), ','), (SELECT count(*) FROM pg_namespace WHERE nspname = $1) FROM readmodel.audit_checkpoints`, sets).Scan(&kept, &schemas); err != nil || kept != "before" || schemas != 0 {
		t.Fatalf("down to 27: rows %q, %d schemas of the sets (%v), want the checkpoint alone and no sets", kept, schemas, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestCheckNamesTheMissingMigrations: a build refuses a database below its
// migrations (ledger serve --migrate=false, and the commands that open the
// stores without migrating them), naming the versions missing and how to
// apply them; once they are applied it accepts it, and refuses it again
// once a version below its highest is missing. On 79be5ba nothing
// checked: the ledger served a database at 00026 and refunded 110 of a 100
// deposit (the reviewer's TestScratchNoBackfill).
func TestCheckNamesTheMissingMigrations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	if _, err := provider(t, u).UpTo(ctx, 26); err != nil {
		t.Fatal(err)
	}
	err := migrations.Check(ctx, u)
	if err == nil || !strings.Contains(err.Error(), "00027") || !strings.Contains(err.Error(), "--migrate") {
		t.Fatalf("a database at 00026: %v", err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Check(ctx, u); err != nil {
		t.Fatalf("a database migrated: %v", err)
	}
	// A version below the highest missing (its row deleted): goose's one-query
	// answer is an error there, and the check still names the version.
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = 5`); err != nil {
		t.Fatal(err)
	}
	err = migrations.Check(ctx, u)
	if err == nil || !strings.Contains(err.Error(), "00005") || strings.Contains(err.Error(), "00027") {
		t.Fatalf("a database without 00005's row: %v", err)
	}
}

// TestDownPastTheWithdrawnMigration (migration 00029): a database migrated
// by a build that had 00021 (0d8b992, withdrawn by c1fd7f0) records it, and
// goose's down stopped at that row with no file for it; 00029 forgets the
// row, after which the way down reaches 00020, and up again.
func TestDownPastTheWithdrawnMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 20); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	// 00021's up, as the builds of 0d8b992 ran it and recorded it.
	mustExec(t, ctx, conn, `CREATE UNIQUE INDEX events_all_key ON events (transaction_id, position);
		ALTER TABLE events DROP CONSTRAINT events_pkey, ADD CONSTRAINT events_pkey PRIMARY KEY USING INDEX events_all_key;
		DROP INDEX events_all_idx;
		INSERT INTO goose_db_version (version_id, is_applied) VALUES (21, true)`)
	if _, err := p.UpTo(ctx, 28); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 20); !errors.Is(err, goose.ErrVersionNotFound) {
		t.Fatalf("down to 20 from 28 over the row of 00021: %v, want goose's %v", err, goose.ErrVersionNotFound)
	}
	if _, err := p.DownTo(ctx, 21); err != nil {
		t.Fatalf("down to 21, above the row: %v", err) // 28..22 went down: the row of 00021 is what stopped it
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 20); err != nil {
		t.Fatalf("down to 20 after 00029: %v", err)
	}
	var version int64
	if err := conn.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil || version != 20 {
		t.Fatalf("version after down to 20: %d (%v)", version, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if err := migrations.Check(ctx, u); err != nil {
		t.Fatal(err)
	}
}

// TestDownToNothingAndUpAgain: every migration's down runs, from the last
// to none (an empty schema but goose's table), and Up then brings the
// database back to a state Check accepts. 00004's down dropped the
// balances generation's table before the view that reads it, and stopped.
func TestDownToNothingAndUpAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := provider(t, u).DownTo(ctx, 0); err != nil {
		t.Fatalf("down to 0: %v", err)
	}
	var left []string
	rows, err := connect(t, ctx, u).Query(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND c.relkind IN ('r', 'v', 'p') AND c.relname <> 'goose_db_version'`)
	if err == nil {
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(left) != 0 {
		t.Fatalf("tables and views left after down to 0: %v (%v)", left, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if err := migrations.Check(ctx, u); err != nil {
		t.Fatal(err)
	}
}

// TestAuditCheckpointChainUpDown (00030): a checkpoint stored before is a
// root as it is (depth 0, no parent, its digests untouched); a delta names
// its parent, which cannot be dropped before it nor be a stop point's; down,
// the deltas go and the roots stay.
func TestAuditCheckpointChainUpDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	p := provider(t, u)
	if _, err := p.UpTo(ctx, 29); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	var root int64
	if err := conn.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, snapshots_recorded, accounts_sha256)
		VALUES (1, 1, 1, 'before', true, 'abc') RETURNING id`).Scan(&root); err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 30); err != nil {
		t.Fatal(err)
	}
	var (
		depth  int
		parent *int64
		sha    string
	)
	if err := conn.QueryRow(ctx, `SELECT depth, parent_id, accounts_sha256 FROM readmodel.audit_checkpoints WHERE id = $1`, root).Scan(&depth, &parent, &sha); err != nil || depth != 0 || parent != nil || sha != "abc" {
		t.Fatalf("up to 30: the checkpoint before is at depth %d, parent %v, digest %q (%v), want a root as it was", depth, parent, sha, err)
	}
	for _, bad := range []string{
		`INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, parent_id, depth) VALUES (2, 2, 2, 'no depth', $1, 0)`,
		`INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, depth) VALUES (2, 2, 2, 'no parent', 1)`,
		`INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, parent_id, depth) VALUES (2, 2, 2, 'a parent not stored', $1 + 100, 1)`,
		`INSERT INTO readmodel.audit_checkpoints (kind, sets, commit_position, prepare_position, events, state, parent_id, depth) VALUES ('stop', 'audit_sets_0123456789abcdef', 2, 2, 2, 'a stop point', $1, 1)`,
	} {
		if _, err := conn.Exec(ctx, bad, root); err == nil {
			t.Fatalf("up to 30: stored: %s", bad)
		}
	}
	mustExec(t, ctx, conn, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, parent_id, depth) VALUES (2, 2, 2, 'delta', `+strconv.FormatInt(root, 10)+`, 1)`)
	if _, err := conn.Exec(ctx, `DELETE FROM readmodel.audit_checkpoints WHERE id = $1`, root); err == nil {
		t.Fatal("up to 30: a delta's parent dropped before it")
	}
	if _, err := p.DownTo(ctx, 29); err != nil {
		t.Fatal(err)
	}
	var kept string
	if err := conn.QueryRow(ctx, `SELECT string_agg(convert_from(state, 'UTF8'), ',') FROM readmodel.audit_checkpoints`).Scan(&kept); err != nil || kept != "before" {
		t.Fatalf("down to 29: rows %q (%v), want the root alone", kept, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
