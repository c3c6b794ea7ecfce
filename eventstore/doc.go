// Package eventstore defines the event-store contract of the ledger: append to a
// stream with an expected revision, read a stream, read and subscribe to "all".
//
// Backends (memory, postgres, kurrentdb) implement it with KurrentDB's idempotency
// rules (the server's IndexWriter) and are checked by one conformance suite,
// eventstore/storetest. Domain types never appear here: events are bytes.
package eventstore
