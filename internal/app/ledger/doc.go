// Package ledger is the command handler: it loads an aggregate, answers a known
// key with its original outcome, decides, appends with the revision it decided on
// and deterministic event IDs, retries a bounded number of times on a concurrent
// write, and builds the reply of PROTOCOL.md §3. The NATS intake calls it.
package ledger
