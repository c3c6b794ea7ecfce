package migrations_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/migrations"
)

// BenchmarkCollateC00015 times migration 00015 on a C.UTF-8 database whose
// read models hold LEDGER_BENCH_ROWS rows (200,000 unless set) in entries and
// in balance_history, a tenth of that in holds and a hundredth in accounts:
// the time its ALTER TABLEs hold their tables.
func BenchmarkCollateC00015(b *testing.B) {
	rows := benchRows(b, 200_000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for range b.N {
		b.StopTimer()
		u := databaseWithLocale(b, ctx, "C.UTF-8")
		upTo(b, ctx, u, 14)
		conn := connect(b, ctx, u)
		mustExec(b, ctx, conn, `INSERT INTO readmodel.entries (event_id, account_id, revision, type, reason, ref, amount, currency, balance_after, idempotency_key, at, effective_at)
			SELECT gen_random_uuid(), 'merchants:' || (i % 1000) || ':payable', i / 1000, 'credited', 'transfer', 'tr-' || i, 1, 'EUR', i, 'key-' || i, now(), now()
			FROM generate_series(1, $1::int) i`, rows)
		mustExec(b, ctx, conn, `INSERT INTO readmodel.balance_history (account_id, revision, event_id, type, currency, balance, held, status, at, effective_at)
			SELECT 'merchants:' || (i % 1000) || ':payable', i / 1000, gen_random_uuid(), 'credited', 'EUR', i, 0, 'open', now(), now()
			FROM generate_series(1, $1::int) i`, rows)
		mustExec(b, ctx, conn, `INSERT INTO readmodel.holds (account_id, hold_id, amount, currency, status, idempotency_key, revision, placed_at, updated_at)
			SELECT 'customers:' || (i % 5000), 'hold-' || i, 1, 'EUR', 'active', 'key-h-' || i, 0, now(), now()
			FROM generate_series(1, $1::int / 10) i`, rows)
		mustExec(b, ctx, conn, `INSERT INTO readmodel.accounts (account_id, currency, overdraft_limit, status, balance, held, revision, opened_at, updated_at)
			SELECT 'customers:' || i, 'EUR', 0, 'open', 0, 0, 0, now(), now() FROM generate_series(1, $1::int / 100) i`, rows)
		mustExec(b, ctx, conn, `VACUUM ANALYZE`)
		b.StartTimer()
		start := time.Now()
		if err := migrations.Up(ctx, u); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/migration")
	}
}

// benchRows is LEDGER_BENCH_ROWS, or def when it is not set.
func benchRows(b *testing.B, def int) int {
	s := os.Getenv("LEDGER_BENCH_ROWS")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
