// Package pgerr names the PostgreSQL errors the ledger tells apart by their
// SQLSTATE (the codes of PostgreSQL's Appendix A), so that each code is
// written in one place and matched with errors.As on pgconn's PgError.
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATEs the ledger tells apart, by their condition names.
const (
	// Warning is the SQLSTATE of a plain warning (a notice's; warning).
	Warning = "01000"
	// UniqueViolation: a row repeats a unique key (unique_violation).
	UniqueViolation = "23505"
	// SerializationFailure: a transaction could not be serialized
	// (serialization_failure).
	SerializationFailure = "40001"
	// DeadlockDetected: a deadlock was broken (deadlock_detected).
	DeadlockDetected = "40P01"
	// InsufficientPrivilege: a privilege is missing, such as CREATE on the
	// database for a schema (insufficient_privilege).
	InsufficientPrivilege = "42501"
	// UndefinedTable: a statement on a table that does not exist
	// (undefined_table).
	UndefinedTable = "42P01"
	// LockNotAvailable: lock_timeout, or NOWAIT (lock_not_available).
	LockNotAvailable = "55P03"
	// QueryCanceled: statement_timeout, or a cancel request
	// (query_canceled).
	QueryCanceled = "57014"
	// AdminShutdown, CrashShutdown, CannotConnectNow: the server is
	// stopping, recovering from a crash, or starting (admin_shutdown,
	// crash_shutdown, cannot_connect_now).
	AdminShutdown    = "57P01"
	CrashShutdown    = "57P02"
	CannotConnectNow = "57P03"
)

// The classes of SQLSTATEs (their first two characters) the ledger tells
// apart.
const (
	// ClassConnectionException: the connection failed (08xxx).
	ClassConnectionException = "08"
	// ClassInsufficientResources: too many connections, out of memory or
	// disk (53xxx).
	ClassInsufficientResources = "53"
)

// InClass reports whether SQLSTATE code is of class (its first two
// characters).
func InClass(code, class string) bool { return len(code) == 5 && code[:2] == class }

// Is reports whether err is, or wraps, a PostgreSQL error of SQLSTATE code.
func Is(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// IsUndefinedTable reports whether err is, or wraps, PostgreSQL's error on a
// table that does not exist (a database not migrated so far).
func IsUndefinedTable(err error) bool { return Is(err, UndefinedTable) }
