// Package pgerr names the PostgreSQL errors the ledger tells apart by their
// SQLSTATE (the codes of PostgreSQL's Appendix A), so that each code is
// written in one place and matched with errors.As on pgconn's PgError.
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// UndefinedTable is the SQLSTATE of a statement on a table that does not
// exist (undefined_table).
const UndefinedTable = "42P01"

// Is reports whether err is, or wraps, a PostgreSQL error of SQLSTATE code.
func Is(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// IsUndefinedTable reports whether err is, or wraps, PostgreSQL's error on a
// table that does not exist (a database not migrated so far).
func IsUndefinedTable(err error) bool { return Is(err, UndefinedTable) }
