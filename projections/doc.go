// Package projections builds the ledger's read models in PostgreSQL from the event
// store's "all": accounts (with holds), entries (the statement), transfers and
// commands (the original reply per idempotency key).
//
// A Runner follows "all" from each projection's checkpoint in batches; a batch's
// read-model rows and its new checkpoint commit in one transaction that
// compare-and-sets the old checkpoint, so a second runner, a crash between write and
// commit, or a redelivered batch never applies an event twice (ARCHITECTURE
// decision 9). Rebuild fills a new generation of a projection's tables beside the
// live one, has it checked, and switches readers to it in one transaction.
// Checkpoints (checkpoints.go) owns every statement on the checkpoint tables.
//
// The tables and the functions that create, publish and drop generations are in
// migrations/00002_read_models.sql; readers use the views readmodel.<table>.
package projections
