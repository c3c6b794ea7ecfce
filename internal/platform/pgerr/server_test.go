package pgerr

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestCodesAreTheServers: each SQLSTATE and class this package names is the
// one PostgreSQL itself gives its condition name (an error raised in
// PL/pgSQL by that name; Warning: a plain WARNING's notice, the name not
// being raisable), so that a code mistyped here fails.
func TestCodesAreTheServers(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var notices []*pgconn.Notice
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DO $$ BEGIN RAISE WARNING 'pgerr test'; END $$`); err != nil || len(notices) != 1 || notices[0].Code != Warning {
		t.Errorf("a WARNING: %v, notices %+v, want one of SQLSTATE %s", err, notices, Warning)
	}
	raise := func(condition string) *pgconn.PgError {
		t.Helper()
		_, err := conn.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'pgerr test' USING ERRCODE = '`+condition+`'; END $$`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Fatalf("%s: %v, want a PostgreSQL error", condition, err)
		}
		return pe
	}
	for _, c := range []struct{ condition, code string }{
		{"unique_violation", UniqueViolation},
		{"serialization_failure", SerializationFailure},
		{"deadlock_detected", DeadlockDetected},
		{"insufficient_privilege", InsufficientPrivilege},
		{"undefined_table", UndefinedTable},
		{"lock_not_available", LockNotAvailable},
		{"query_canceled", QueryCanceled},
		{"admin_shutdown", AdminShutdown},
		{"crash_shutdown", CrashShutdown},
		{"cannot_connect_now", CannotConnectNow},
	} {
		if pe := raise(c.condition); !Is(pe, c.code) {
			t.Errorf("%s is SQLSTATE %s, pgerr says %s", c.condition, pe.Code, c.code)
		}
	}
	for _, c := range []struct{ condition, class string }{
		{"connection_exception", ClassConnectionException},
		{"connection_failure", ClassConnectionException},
		{"insufficient_resources", ClassInsufficientResources},
		{"too_many_connections", ClassInsufficientResources},
	} {
		if pe := raise(c.condition); !InClass(pe.Code, c.class) {
			t.Errorf("%s is SQLSTATE %s, not of pgerr's class %s", c.condition, pe.Code, c.class)
		}
	}
}
