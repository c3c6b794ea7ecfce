// Package bench drives the ledger and a baseline over NATS and reports what they
// sustain: `ledger bench`. The baseline is the pattern of the seed documents (an
// idempotency_keys table, one transaction per command) behind the same NATS
// intake, on the same PostgreSQL; see BENCHMARKS.md for the figures.
package bench
