// Package query answers the read side's queries (PROTOCOL.md §4) from the read
// models: account, entries, balance, balances (the sums over a group of
// accounts by ID prefix), transfer and command. A query that passes
// min_position waits, up to a bounded time, until the projection serving it has
// reached that position. It holds no transport: natsapi serves it on
// ledger.v1.query.<name> and httpapi on GET /v1/accounts/{id}, GET
// /v1/balances and the rest.
package query
