// Package config is what the ledger's programs share about their configuration:
// the LEDGER_* environment variables and the flags bound to them, the logger,
// NATS connection options (credentials, nkeys, TLS), opening the event store named
// by a URL, the dev.json a running `ledger dev` leaves in its data dir, and the
// redaction of secrets in URLs before they reach a log.
package config
