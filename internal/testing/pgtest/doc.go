// Package pgtest gives each test a fresh, empty PostgreSQL database: on the server
// of LEDGER_TEST_DATABASE_URL when set, otherwise on a private cluster (pgcluster)
// started once per test binary and stopped by Main.
package pgtest
