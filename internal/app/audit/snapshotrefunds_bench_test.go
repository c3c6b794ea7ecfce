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
// --recent-refunds) and whose snapshot, at its last revision, lists them
// all, saying it forgot none: what checking every refunded sum and original
// of a snapshot costs (one read of the account's stream up to it, as the fold
// forgot some: sameAllRefunded, snapshotrefunds.go) beside the rest of the
// audit of that account's 2N+2 events.
func BenchmarkAuditSnapshotRefunds(b *testing.B) {
	n := 1024
	if v, err := strconv.Atoi(os.Getenv("LEDGER_BENCH_REFUNDED")); err == nil && v > 0 {
		n = v
	}
	env := projtest.New(b)
	env.MustApply(b, "open_account", map[string]any{"idempotency_key": "b-open", "account_id": "b", "currency": "EUR"})
	for i := range n {
		env.MustApply(b, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("b-d%d", i), "account_id": "b", "amount": 1000, "currency": "EUR"})
		env.MustApply(b, "refund", map[string]any{"idempotency_key": fmt.Sprintf("b-f%d", i), "original_key": fmt.Sprintf("b-d%d", i), "amount": 1 + i%100})
	}
	a := accountAt(b, env, "b", 0)
	if len(a.Refunded) != n {
		b.Fatalf("b refunded %d originals, not %d", len(a.Refunded), n)
	}
	writeSnapshot(b, env, a, uint64(a.Revision), nil)
	catchUp(b, env)
	for b.Loop() {
		if rep := run(b, env, audit.Options{}); !rep.OK() || rep.Snapshots != 1 {
			b.Fatalf("ok %v, %d snapshots checked: %v", rep.OK(), rep.Snapshots, rep.Violations)
		}
	}
}
