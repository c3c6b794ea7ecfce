package pgcluster

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MaxDatabaseName is the longest database name PostgreSQL keeps
// (NAMEDATALEN-1 bytes): a longer one it truncates, with a notice, so that
// dropping it would drop the database of the truncated name.
const MaxDatabaseName = 63

// CreateDatabase creates the empty database name on the server at admin (the
// URL of another of its databases, as a role allowed to create databases).
func CreateDatabase(ctx context.Context, admin, name string) error {
	return onAdmin(ctx, admin, name, func(conn *pgx.Conn) error { return createDatabase(ctx, conn, name) })
}

// DropDatabase drops the database name, if it exists, on the server at admin,
// ending the sessions still on it (WITH (FORCE), PostgreSQL 13+).
func DropDatabase(ctx context.Context, admin, name string) error {
	return onAdmin(ctx, admin, name, func(conn *pgx.Conn) error { return dropDatabase(ctx, conn, name) })
}

// RecreateDatabase drops the database name, as DropDatabase, and creates it
// again, empty.
func RecreateDatabase(ctx context.Context, admin, name string) error {
	return onAdmin(ctx, admin, name, func(conn *pgx.Conn) error {
		if err := dropDatabase(ctx, conn, name); err != nil {
			return err
		}
		return createDatabase(ctx, conn, name)
	})
}

// checkDatabaseName refuses a name PostgreSQL would not keep as given: empty,
// over MaxDatabaseName bytes, or holding a NUL (which pgx.Identifier drops).
func checkDatabaseName(name string) error {
	if name == "" || len(name) > MaxDatabaseName || strings.ContainsRune(name, 0) {
		return fmt.Errorf("pgcluster: database name %q: want 1-%d bytes, no NUL", name, MaxDatabaseName)
	}
	return nil
}

// onAdmin checks name, then runs f on a connection to admin.
func onAdmin(ctx context.Context, admin, name string, f func(*pgx.Conn) error) error {
	if err := checkDatabaseName(name); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

func createDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	if err := checkDatabaseName(name); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgcluster: create database %s: %w", name, err)
	}
	return nil
}

func dropDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	if err := checkDatabaseName(name); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgcluster: drop database %s: %w", name, err)
	}
	return nil
}
