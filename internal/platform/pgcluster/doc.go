// Package pgcluster runs a private PostgreSQL cluster from the machine's own server
// binaries (initdb, pg_ctl), as the postgres OS user when run as root, and a Pair:
// a primary with a synchronous standby that fails over and back (pg_basebackup -R,
// pg_ctl promote, pg_rewind), the production shape of docs/operations.md.
// Tests use it through internal/pgtest; `ledger dev` uses it when no database URL is given.
package pgcluster
