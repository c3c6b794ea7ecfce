package audit_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// BenchmarkAuditSnapshotRefunds: a full audit of one account that refunded
// LEDGER_BENCH_REFUNDED originals (default 1,024, a ledger's
// --recent-refunds), after LEDGER_BENCH_HISTORY other deposits (default 0),
// and whose snapshot, at its last revision, lists them all, saying it forgot
// none: what checking every refunded sum and original of a snapshot costs
// (one indexed read per original the fold does not keep, their sums against
// the fold's total of the refunds, snapshotrefunds.go; before that total,
// one read of the account's stream up to the snapshot) beside the rest of
// the audit of that account's 2N+H+2 events (with LEDGER_BENCH_INCREMENTAL=1,
// an incremental audit of one more event after a checkpoint).
func BenchmarkAuditSnapshotRefunds(b *testing.B) {
	n, history := 1024, 0
	if v, err := strconv.Atoi(os.Getenv("LEDGER_BENCH_REFUNDED")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("LEDGER_BENCH_HISTORY")); err == nil && v > 0 {
		history = v
	}
	env := projtest.New(b)
	env.MustApply(b, "open_account", map[string]any{"idempotency_key": "b-open", "account_id": "b", "currency": "EUR"})
	for i := range history {
		env.MustApply(b, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("b-h%d", i), "account_id": "b", "amount": 10, "currency": "EUR"})
	}
	for i := range n {
		env.MustApply(b, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("b-d%d", i), "account_id": "b", "amount": 1000, "currency": "EUR"})
		env.MustApply(b, "refund", map[string]any{"idempotency_key": fmt.Sprintf("b-f%d", i), "original_key": fmt.Sprintf("b-d%d", i), "amount": 1 + i%100})
	}
	opts := audit.Options{}
	if os.Getenv("LEDGER_BENCH_INCREMENTAL") == "1" {
		opts.From = checkpointThenDeposit(b, env)
	}
	a := accountAt(b, env, "b", 0)
	if a.Refunded.Len() != n {
		b.Fatalf("b refunded %d originals, not %d", a.Refunded.Len(), n)
	}
	writeSnapshot(b, env, a, uint64(a.Revision), nil)
	catchUp(b, env)
	for b.Loop() {
		if rep := run(b, env, opts); !rep.OK() || rep.Snapshots != 1 {
			b.Fatalf("ok %v, %d snapshots checked: %v", rep.OK(), rep.Snapshots, rep.Violations)
		}
	}
}

// checkpointThenDeposit stores a full audit's checkpoint of the benchmark's
// history and deposits once more on b after it, so that an incremental
// audit from it (LEDGER_BENCH_INCREMENTAL=1) folds one event of b's and
// checks the snapshot written at b's last revision: what it pays for that
// snapshot beside an event.
func checkpointThenDeposit(b *testing.B, env *projtest.Env) *int64 {
	catchUp(b, env)
	rep := run(b, env, audit.Options{SaveCheckpoint: true})
	if !rep.OK() || rep.Checkpoint == nil {
		b.Fatalf("the checkpointing audit: ok %v: %v", rep.OK(), rep.Violations)
	}
	env.MustApply(b, "deposit", map[string]any{"idempotency_key": "b-after", "account_id": "b", "amount": 10, "currency": "EUR"})
	return &rep.Checkpoint.ID
}
