// Package query answers the read side's queries (PROTOCOL.md §4) from the read
// models: ledger.v1.query.account|entries|transfer|command over NATS, and the same
// over HTTP (GET /v1/accounts/{id}, /v1/accounts/{id}/entries, /v1/transfers/{id},
// /v1/commands/{key}). A query that passes min_position waits, up to a bounded
// time, until the projection serving it has reached that position.
package query
