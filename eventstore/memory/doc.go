// Package memory is an in-memory event store with the rules of the PostgreSQL
// store (KurrentDB's idempotency rules, unique event IDs), for tests and dev.
// Positions are {n, n} for the n-th event; nothing survives the process.
package memory
