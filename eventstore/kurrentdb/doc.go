// Package kurrentdb is the event-store contract (package eventstore) over KurrentDB
// (EventStoreDB) through github.com/EventStore/EventStore-Client-Go/v4.
//
// Open takes the ledger's LEDGER_EVENTSTORE_URL, kurrentdb://host:2113?tls=false or
// esdb://..., and returns a *Store. Idempotency is the server's own (IndexWriter);
// errors are mapped with errors.As, since the client's esdb.FromError only type-asserts.
// The store does not implement eventstore.MultiAppender: the client has no
// multi-stream transaction. System records ($-prefixed streams and event types) are
// left out of "all". Package kurrenttest is an in-process server for tests.
package kurrentdb
