// Package domain is the pure core of the ledger: money, accounts, holds, transfers
// and refunds; commands, events and rejection codes; Decide and Evolve.
//
// It does no I/O, reads no clock and draws no random numbers: time comes in on the
// command, and event IDs are derived from the idempotency key (UUIDv5).
package domain
