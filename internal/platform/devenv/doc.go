// Package devenv runs the whole ledger in one process for a laptop or a test: an
// embedded nats-server with JetStream on disk (see embednats), a private
// PostgreSQL cluster from the machine's server binaries (or a given database),
// the migrations, and a ledger node with its background runners. `ledger dev` is
// a thin shell around Start; the tests use it in-process.
package devenv
