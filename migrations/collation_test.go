package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// TestReadModelsInCollationC (migration 00015): on a database whose default
// collation is not byte order (C.UTF-8, which every glibc system has), the
// read models' text columns end in collation "C": those of the generations
// that existed before 00015, with rows in them and their views made again
// over them (the rows still read through the views), and those of a
// generation made and published afterwards, as a rebuild does. On a
// database in collation C (the harness's), 00015 alters nothing.
func TestReadModelsInCollationC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, conn := before00015(t, ctx)
	mustExec(t, ctx, conn, `INSERT INTO readmodel.accounts (account_id, currency, overdraft_limit, status, balance, held, revision, opened_at, updated_at)
		VALUES ('m:1', 'EUR', 0, 'open', 5, 0, 0, now(), now()), ('m.2', 'EUR', 0, 'open', 7, 0, 0, now(), now())`)
	if n := unorderedColumns(t, ctx, conn); len(n) == 0 {
		t.Fatal("before 00015, no read-model text column is in the database's C.UTF-8: the test shows nothing")
	}

	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	if n := unorderedColumns(t, ctx, conn); len(n) != 0 {
		t.Fatalf("after 00015, read-model text columns (tables and views) not in collation C: %v", n)
	}
	var sum int64
	if err := conn.QueryRow(ctx, `SELECT sum(balance) FROM readmodel.accounts WHERE account_id >= 'm:' AND account_id < 'm;'`).Scan(&sum); err != nil || sum != 5 {
		t.Fatalf("the accounts view after 00015, byte-ordered range m: to m;: sum %d (%v), want 5", sum, err)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.create_generation(p, 2), readmodel.publish_generation(p, 2)
		FROM unnest(ARRAY['accounts', 'entries', 'transfers', 'commands', 'balances']) AS p`)
	if n := unorderedColumns(t, ctx, conn); len(n) != 0 {
		t.Fatalf("a generation made after 00015: text columns not in collation C: %v", n)
	}

	plain := pgtest.URL(t) // the harness's database, in collation C
	upTo(t, ctx, plain, 14)
	before := columnCollations(t, ctx, connect(t, ctx, plain))
	if err := migrations.Up(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if after := columnCollations(t, ctx, connect(t, ctx, plain)); after != before {
		t.Fatalf("00015 on a database in collation C changed the columns' collations: %s, then %s", before, after)
	}
}

// databaseWithLocale creates a database of the given locale beside the
// harness's database for t, and returns its URL; it is dropped when t ends.
func databaseWithLocale(t testing.TB, ctx context.Context, locale string) string {
	t.Helper()
	base := pgtest.URL(t)
	admin := connect(t, ctx, base)
	name := fmt.Sprintf("collate_%d", time.Now().UnixNano())
	mustExec(t, ctx, admin, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE template0 ENCODING 'UTF8' LOCALE '%s'`, name, locale))
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pgcluster.DropDatabase(cctx, base, name); err != nil {
			t.Error(err)
		}
	})
	pu, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/" + name
	return pu.String()
}

// before00015 is a database in C.UTF-8 (databaseWithLocale) migrated up to
// 00014, and a connection to it.
func before00015(t testing.TB, ctx context.Context) (string, *pgx.Conn) {
	t.Helper()
	u := databaseWithLocale(t, ctx, "C.UTF-8")
	upTo(t, ctx, u, 14)
	return u, connect(t, ctx, u)
}

// stillAt14 fails t unless the database is at 00014 (after a failed 00015).
func stillAt14(t testing.TB, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	var version int64
	if err := conn.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil || version != 14 {
		t.Fatalf("after the failed 00015: version %d (%v), want 14", version, err)
	}
}

// upTo applies the migrations up to version.
func upTo(t testing.TB, ctx context.Context, u string, version int64) {
	t.Helper()
	if _, err := provider(t, u).UpTo(ctx, version); err != nil {
		t.Fatal(err)
	}
}

// provider is a goose provider of the migrations on the database at u,
// closed when t ends.
func provider(t testing.TB, u string) *goose.Provider {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func connect(t testing.TB, ctx context.Context, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t testing.TB, ctx context.Context, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// readModelTextColumns selects the text columns of the read models: the
// tables of their generations (<table>_g<N>) and the views over them, with
// whether each compares in byte order.
const readModelTextColumns = `SELECT c.relname, a.attname, coalesce(co.collname, '') AS coll,
		CASE WHEN a.attcollation = 100 THEN d.datcollate IN ('C', 'POSIX') ELSE co.collname IN ('C', 'POSIX') END AS byte_order
	FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
	CROSS JOIN (SELECT datcollate FROM pg_database WHERE datname = current_database()) d
	WHERE n.nspname = 'readmodel' AND (c.relkind = 'r' AND c.relname ~ '_g[0-9]+$' OR c.relkind = 'v') AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'text'::regtype`

// unorderedColumns lists the read models' text columns not in byte order.
func unorderedColumns(t *testing.T, ctx context.Context, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT relname || '.' || attname FROM (`+readModelTextColumns+`) x WHERE NOT byte_order ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// columnCollations lists every read-model text column with its collation.
func columnCollations(t *testing.T, ctx context.Context, conn *pgx.Conn) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(relname || '.' || attname || '=' || coll, ',' ORDER BY relname, attname), '') FROM (`+readModelTextColumns+`) x`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCollateCAltersEachTableOnce (migration 00015): each table's text
// columns are altered by one ALTER TABLE, so that an index over several of
// them (holds' primary key on account_id, hold_id) is rebuilt once.
func TestCollateCAltersEachTableOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, conn := before00015(t, ctx)
	mustExec(t, ctx, conn, `CREATE TABLE public.altered (tbl text NOT NULL);
		CREATE FUNCTION public.count_alters() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.altered SELECT object_identity FROM pg_event_trigger_ddl_commands() WHERE command_tag = 'ALTER TABLE';
		END $$;
		CREATE EVENT TRIGGER count_alters ON ddl_command_end WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION public.count_alters()`)

	upTo(t, ctx, u, 15) // 00015 alone: later migrations alter tables of their own
	var many string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(tbl || ' ' || n, ', ' ORDER BY tbl), '')
		FROM (SELECT tbl, count(*) AS n FROM public.altered GROUP BY tbl HAVING count(*) > 1) x`).Scan(&many); err != nil {
		t.Fatal(err)
	}
	if many != "" {
		t.Fatalf("tables altered more than once by 00015: %s", many)
	}
	var holds int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM public.altered WHERE tbl = 'readmodel.holds_g1'`).Scan(&holds); err != nil || holds != 1 {
		t.Fatalf("readmodel.holds_g1 altered %d times (%v), want once", holds, err)
	}
}

// TestCollateCKeepsTheViewsPrivileges (migration 00015): the views 00015
// drops and makes again keep their owner (another role's view too), their
// privileges (a role granted SELECT on one before the migration can still
// read it after), their column privileges, their options (security_barrier,
// security_invoker) and their comments and their columns'; a user's view over
// a read model's view, or over a generation's table, or a rule on one of
// them, stops the migration, which then leaves everything as it was.
func TestCollateCKeepsTheViewsPrivileges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	role := fmt.Sprintf("reader_%d", time.Now().UnixNano())
	admin := connect(t, ctx, pgtest.URL(t))
	mustExec(t, ctx, admin, fmt.Sprintf(`CREATE ROLE %s`, role))
	t.Cleanup(func() { // after the database is dropped (cleanups run last first)
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(cctx, fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role)); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u, conn := before00015(t, ctx)
	mustExec(t, ctx, conn, fmt.Sprintf(`GRANT SELECT ON readmodel.accounts TO %s; GRANT SELECT, INSERT ON readmodel.entries TO %[1]s WITH GRANT OPTION;
		GRANT SELECT (transfer_id, amount) ON readmodel.transfers TO %[1]s; GRANT UPDATE (status) ON readmodel.accounts TO %[1]s;
		COMMENT ON VIEW readmodel.accounts IS 'balances, as of the projector''s checkpoint';
		COMMENT ON COLUMN readmodel.transfers.amount IS 'minor units';
		ALTER VIEW readmodel.entries SET (security_barrier = true);
		ALTER VIEW readmodel.transfers SET (security_invoker = true, security_barrier = false);
		ALTER VIEW readmodel.commands OWNER TO %[1]s`, role))
	before := viewPrivileges(t, ctx, conn)

	mustExec(t, ctx, conn, `CREATE VIEW public.account_ids AS SELECT account_id FROM readmodel.accounts`)
	err := migrations.Up(ctx, u)
	if err == nil || !strings.Contains(err.Error(), "other objects depend on it") {
		t.Fatalf("00015 with a user's view over readmodel.accounts: %v, want cannot drop view ... other objects depend on it", err)
	}
	stillAt14(t, ctx, conn)
	if n := unorderedColumns(t, ctx, conn); len(n) == 0 {
		t.Fatal("after the failed 00015, columns altered")
	}
	mustExec(t, ctx, conn, `DROP VIEW public.account_ids; CREATE VIEW public.account_ids AS SELECT account_id FROM readmodel.accounts_g1`)
	if err := migrations.Up(ctx, u); err == nil || !strings.Contains(err.Error(), "cannot alter type of a column used by a view or rule") {
		t.Fatalf("00015 with a user's view over readmodel.accounts_g1: %v, want cannot alter type of a column used by a view or rule", err)
	}
	mustExec(t, ctx, conn, `DROP VIEW public.account_ids; CREATE RULE keep_holds AS ON DELETE TO readmodel.holds DO INSTEAD NOTHING`)
	if err := migrations.Up(ctx, u); err == nil || !strings.Contains(err.Error(), "has a trigger or a rule of its own") {
		t.Fatalf("00015 with a rule on readmodel.holds: %v, want has a trigger or a rule of its own", err)
	}
	mustExec(t, ctx, conn, `DROP RULE keep_holds ON readmodel.holds`)

	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	if n := unorderedColumns(t, ctx, conn); len(n) != 0 {
		t.Fatalf("after 00015, read-model text columns not in collation C: %v", n)
	}
	if after := viewPrivileges(t, ctx, conn); after != before {
		t.Fatalf("the views' owners and privileges before 00015:\n%s\nafter:\n%s", before, after)
	}
}

// viewPrivileges lists the read models' views with their owner, ACL,
// options and comment, and their columns with a column ACL or comment.
func viewPrivileges(t testing.TB, ctx context.Context, conn *pgx.Conn) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(ctx, `SELECT string_agg(concat_ws(' ', relname, pg_get_userbyid(relowner), coalesce(relacl::text, 'default'),
			reloptions::text, obj_description(c.oid, 'pg_class'), cols), E'\n' ORDER BY relname)
		FROM pg_class c, LATERAL (SELECT string_agg(concat_ws(' ', attname, attacl::text, col_description(c.oid, attnum)), '; ' ORDER BY attnum) AS cols
			FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND (attacl IS NOT NULL OR col_description(c.oid, attnum) IS NOT NULL)) a
		WHERE relnamespace = 'readmodel'::regnamespace AND relkind = 'v'`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCollateCDown (migration 00015): after migrating down from 00015 on a
// database it converted, the views keep their privileges, an earlier build's
// rebuild still makes and publishes a new generation over them, and the
// migration goes up again.
func TestCollateCDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := databaseWithLocale(t, ctx, "C.UTF-8")
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, u)
	mustExec(t, ctx, conn, `GRANT SELECT ON readmodel.accounts TO PUBLIC`)
	before := viewPrivileges(t, ctx, conn)
	if _, err := provider(t, u).DownTo(ctx, 14); err != nil {
		t.Fatal(err)
	}
	if after := viewPrivileges(t, ctx, conn); after != before {
		t.Fatalf("the views' owners and privileges before the down step:\n%s\nafter:\n%s", before, after)
	}
	mustExec(t, ctx, conn, `SELECT readmodel.create_generation(name, 2), readmodel.publish_generation(name, 2), readmodel.drop_generation(name, 1)
		FROM readmodel.checkpoints`)
	mustExec(t, ctx, conn, `UPDATE readmodel.checkpoints SET generation = 2`)
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := unorderedColumns(t, ctx, conn); len(n) != 0 {
		t.Fatalf("up again: read-model text columns not in collation C: %v", n)
	}
}

// TestCollateCFailsFastBehindALongReader (migration 00015): a transaction
// reading a read model (an audit's, say) and left open makes 00015 fail
// once lock_timeout is over, saying what to do, and leaves the database at
// 00014, rather than waiting for it with every reader and writer queued
// behind.
func TestCollateCFailsFastBehindALongReader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, conn := before00015(t, ctx)
	reader, err := connect(t, ctx, u).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM readmodel.entries`); err != nil {
		t.Fatal(err)
	}

	uctx, ucancel := context.WithTimeout(ctx, time.Minute) // the old migration waited for the reader as long as asked
	defer ucancel()
	err = migrations.Up(uctx, u)
	if err == nil || !strings.Contains(err.Error(), "waited more than lock_timeout") || !strings.Contains(err.Error(), "stop audits") {
		t.Fatalf("00015 behind an open reader of readmodel.entries: %v, want waited more than lock_timeout ... stop audits", err)
	}
	stillAt14(t, ctx, conn)
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("00015 once the reader is gone: %v", err)
	}
}
