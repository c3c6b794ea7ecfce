// Package postgres is the PostgreSQL event store: one events table (migrations
// 00001), appends serialised per stream by advisory locks, and a gap-safe "all"
// read in (transaction id, position) order below the oldest running transaction.
package postgres
