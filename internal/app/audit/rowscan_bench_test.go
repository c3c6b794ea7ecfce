package audit

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkTableRowsDigest: what reading a hashed read-model table for its
// digest costs (digestOfTable: the audit's read while the fold runs, the
// rebuild check's first read), an op a read of LEDGER_BENCH_ROWS rows
// (default 10,000) of each table: allocs/op and B/op over that many rows.
//
//	go test ./internal/app/audit -run '^$' -bench TableRowsDigest -benchmem -count 3
func BenchmarkTableRowsDigest(b *testing.B) {
	ctx := context.Background()
	pool, _ := devtest.BenchAccounts(b)
	n := devtest.BenchEnv("LEDGER_BENCH_ROWS", 10_000)
	for _, sql := range []string{
		`INSERT INTO readmodel.entries (event_id, account_id, revision, type, reason, ref, amount, currency, balance_after, idempotency_key, at, metadata, effective_at)
			SELECT gen_random_uuid(), 'hist-acc-' || i, i, 'FundsDeposited', 'deposit', '', i, 'EUR', i * 10, 'hist-key-' || i, now(), '{}', now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.balance_history (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
			SELECT 'hist-acc-' || i, i, gen_random_uuid(), 'FundsDeposited', 'EUR', i, 0, 'open', now(), now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.commands (idempotency_key, stream, command, status, code, first_revision, last_revision, reply, at)
			SELECT 'hist-key-' || i, 'account-hist-acc-' || i, 'deposit', 'applied', '', i, i,
				('{"status":"applied","idempotency_key":"hist-key-' || i || '","events":[{"id":"' || gen_random_uuid() || '","stream":"account-hist-acc-' || i || '","revision":' || i || ',"type":"FundsDeposited"}],"balance":' || i || ',"duplicate":false}')::json,
				now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.transfers (transfer_id, from_account, to_account, amount, currency, status, refunded, idempotency_key, revision, requested_at, updated_at)
			SELECT 'hist-t-' || i, 'hist-acc-' || i, 'hist-acc-' || (i + 1), i, 'EUR', 'completed', 0, 'hist-tk-' || i, 3, now(), now() FROM generate_series(1, $1) i`,
		`INSERT INTO readmodel.holds (account_id, hold_id, amount, currency, status, captured, expires_at, idempotency_key, revision, placed_at, updated_at)
			SELECT 'hist-acc-' || i, 'hold-' || i, 100, 'EUR', 'active', 0, now() + interval '1 day', 'hist-hold-' || i, 2, now(), now() FROM generate_series(1, $1) i`,
	} {
		if _, err := pool.Exec(ctx, sql, n); err != nil {
			b.Fatal(err)
		}
	}
	for _, table := range []string{"entries", "balance_history", "commands", "transfers", "holds"} {
		b.Run(table, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d, err := digestOfTable(ctx, tableRead{q: pool, table: table}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if d.n != n {
					b.Fatalf("%d rows read, want %d", d.n, n)
				}
			}
		})
	}
}
