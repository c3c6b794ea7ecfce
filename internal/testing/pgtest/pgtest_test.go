package pgtest

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func scalar[T any](t *testing.T, dbURL, sql string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v T
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func dbName(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(p.Path, "/")
}

func TestFreshDatabases(t *testing.T) {
	var first, admin string
	t.Run("create", func(t *testing.T) {
		a, b := URL(t), URL(t)
		if a == b {
			t.Fatalf("same URL twice: %s", a)
		}
		if got := scalar[string](t, a, "SELECT current_database()"); got != dbName(t, a) || !strings.HasPrefix(got, "t_") {
			t.Fatalf("current_database = %q for %s", got, a)
		}
		// Empty: no user tables.
		if n := scalar[int64](t, a, "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog','information_schema')"); n != 0 {
			t.Fatalf("%d tables in a fresh database", n)
		}
		first = a
		admin, _ = adminURL()
	})
	// The subtest's clean-up dropped its databases.
	if n := scalar[int64](t, admin, "SELECT count(*) FROM pg_database WHERE datname = '"+dbName(t, first)+"'"); n != 0 {
		t.Fatalf("database %s not dropped", dbName(t, first))
	}
}

// TestEnvURL: with LEDGER_TEST_DATABASE_URL set, databases are created on that
// server (here: the shared cluster, reached through the variable).
func TestEnvURL(t *testing.T) {
	admin, err := adminURL()
	if err != nil {
		t.Fatal(err)
	}
	server, err := withDatabase(admin, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvURL, server+"&application_name=pgtest")
	u := URL(t)
	if !strings.Contains(u, "application_name=pgtest") {
		t.Fatalf("URL %s lost the query of %s", u, EnvURL)
	}
	if got := scalar[string](t, u, "SELECT current_setting('application_name')"); got != "pgtest" {
		t.Fatalf("application_name = %q", got)
	}
	if got := scalar[string](t, u, "SELECT current_database()"); got != dbName(t, u) {
		t.Fatalf("current_database = %q", got)
	}
}

func TestWithDatabase(t *testing.T) {
	got, err := withDatabase("postgres://u:p@h:5/old?sslmode=disable&dbname=x", "new")
	if err != nil || got != "postgres://u:p@h:5/new?sslmode=disable" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := withDatabase("host=h dbname=x", "new"); err == nil {
		t.Fatal("a key/value DSN was accepted")
	}
}
