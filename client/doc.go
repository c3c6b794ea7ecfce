// Package client is the ledger's Go client (PROTOCOL.md §7): typed commands and
// replies over NATS, the protocol's one rule for callers written once (an
// unanswered command is resent with the same idempotency key until the answer
// is definite), concurrent calls coalesced into ledger.v1.cmd.batch requests,
// explicit and atomic batches, and the queries.
//
// A call returns an error only when no definite answer came: before its
// context ended, or because no request can carry it (a closed client or
// connection, a body over the server's max payload); "rejected" and "invalid"
// are replies, not errors.
package client
