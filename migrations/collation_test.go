package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

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
	u := databaseWithLocale(t, ctx, "C.UTF-8")
	upTo(t, ctx, u, 14)
	conn := connect(t, ctx, u)
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
func databaseWithLocale(t *testing.T, ctx context.Context, locale string) string {
	t.Helper()
	base := pgtest.URL(t)
	admin := connect(t, ctx, base)
	name := fmt.Sprintf("collate_%d", time.Now().UnixNano())
	mustExec(t, ctx, admin, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE template0 ENCODING 'UTF8' LOCALE '%s'`, name, locale))
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(cctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	pu, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/" + name
	return pu.String()
}

// upTo applies the migrations up to version.
func upTo(t *testing.T, ctx context.Context, u string, version int64) {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS(), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatal(err)
	}
}

func connect(t *testing.T, ctx context.Context, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
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
