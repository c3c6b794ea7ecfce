// Package config is what the ledger's programs share about their configuration
// and start-up: the LEDGER_* environment variables and the flags bound to them,
// the logger, NATS connection options (credentials, nkeys, TLS), opening the
// event store named by a URL and the stores a command needs (OpenStores), the
// dev.json a running `ledger dev` leaves in its data dir, the redaction of
// secrets in URLs before they reach a log, and Main, both programs' main.
package config
