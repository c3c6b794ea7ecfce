// Package pgcluster runs a private PostgreSQL cluster from the machine's own server
// binaries (initdb, pg_ctl), as the postgres OS user when run as root.
// Tests use it through internal/pgtest; `ledger dev` uses it when no database URL is given.
package pgcluster
