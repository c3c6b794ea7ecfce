package pgcluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// connectTo connects to the database name of admin's server (""; admin's).
func connectTo(t *testing.T, ctx context.Context, admin, name string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	if name != "" {
		cfg.Database = name
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to %s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func databaseExists(t *testing.T, ctx context.Context, admin *pgx.Conn, name string) bool {
	t.Helper()
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// TestDatabaseHelpers: on pgtest's server, CreateDatabase makes a database;
// RecreateDatabase empties it while a session holds a transaction open on
// it; DropDatabase drops it with a session open, and again without an error
// once it is gone. The name needs quoting (upper case, a quote, a space).
func TestDatabaseHelpers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := pgtest.URL(t)
	adminConn := connectTo(t, ctx, admin, "")
	const name = `Helper "db" one`
	t.Cleanup(func() { pgcluster.DropDatabase(context.Background(), admin, name) })

	if err := pgcluster.CreateDatabase(ctx, admin, name); err != nil {
		t.Fatal(err)
	}
	held := connectTo(t, ctx, admin, name)
	if _, err := held.Exec(ctx, "CREATE TABLE kept (n int); BEGIN; INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := pgcluster.RecreateDatabase(ctx, admin, name); err != nil {
		t.Fatalf("recreate with a session in a transaction: %v", err)
	}
	if held.Ping(ctx) == nil {
		t.Error("the session on the recreated database is still alive")
	}
	var tables int
	if err := connectTo(t, ctx, admin, name).QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'").Scan(&tables); err != nil || tables != 0 {
		t.Errorf("recreated database: %d tables named kept (%v), want 0", tables, err)
	}
	if err := pgcluster.DropDatabase(ctx, admin, name); err != nil {
		t.Fatalf("drop with a session open: %v", err)
	}
	if databaseExists(t, ctx, adminConn, name) {
		t.Errorf("%q still exists after DropDatabase", name)
	}
	if err := pgcluster.DropDatabase(ctx, admin, name); err != nil {
		t.Errorf("drop of a missing database: %v", err)
	}
}

// TestDatabaseHelpersRefuseABadName: an empty name, a NUL, and a name over
// 63 bytes (which PostgreSQL would truncate to another database's name) are
// refused by each helper, and nothing is written: the database named by the
// first 63 bytes is neither dropped nor created.
func TestDatabaseHelpersRefuseABadName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := pgtest.URL(t)
	adminConn := connectTo(t, ctx, admin, "")
	kept := "k" + strings.Repeat("x", pgcluster.MaxDatabaseName-1)
	t.Cleanup(func() { pgcluster.DropDatabase(context.Background(), admin, kept) })
	if err := pgcluster.CreateDatabase(ctx, admin, kept); err != nil {
		t.Fatal(err)
	}
	helpers := map[string]func(context.Context, string, string) error{
		"create": pgcluster.CreateDatabase, "drop": pgcluster.DropDatabase, "recreate": pgcluster.RecreateDatabase,
	}
	for _, bad := range []string{"", "a\x00b", kept + "y"} {
		for what, f := range helpers {
			if err := f(ctx, admin, bad); err == nil || !strings.Contains(err.Error(), "want 1-63 bytes, no NUL") {
				t.Errorf("%s %q: %v, want the name refused", what, bad, err)
			}
		}
	}
	if !databaseExists(t, ctx, adminConn, kept) {
		t.Errorf("%s was dropped through a longer name", kept)
	}
	if databaseExists(t, ctx, adminConn, "a") || databaseExists(t, ctx, adminConn, "ab") {
		t.Error("a name with a NUL created a database")
	}
}
