// Package e2e holds end-to-end tests: the ledger's programs assembled as they run
// in production (NATS intake, command service, event store, projector, queries),
// against real servers (an embedded nats-server, PostgreSQL for the read models)
// and the KurrentDB test server (eventstore/kurrentdb/kurrenttest).
package e2e
