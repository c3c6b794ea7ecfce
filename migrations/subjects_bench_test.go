package migrations_test

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSubjectsBackfill00027 times migration 00027 from 00026 on an
// events table of LEDGER_BENCH_ROWS events (1,000,000 unless set), none with
// a subject, each ten of them: six deposits (with client metadata), a
// withdrawal, a refund, a hold placed and a hold captured (the three last
// given a subject by 00027).
func BenchmarkSubjectsBackfill00027(b *testing.B) {
	rows := benchRows(b, 1_000_000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for range b.N {
		b.StopTimer()
		u := databaseWithLocale(b, ctx, "C.UTF-8")
		p := provider(b, u)
		if _, err := p.UpTo(ctx, 26); err != nil {
			b.Fatal(err)
		}
		conn := connect(b, ctx, u)
		mustExec(b, ctx, conn, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
			SELECT 'account-' || (i % 10000), i / 10000, gen_random_uuid(),
				CASE WHEN i % 10 < 6 THEN 'Credited' WHEN i % 10 < 8 THEN 'Debited' WHEN i % 10 = 8 THEN 'HoldPlaced' ELSE 'HoldCaptured' END,
				convert_to(CASE WHEN i % 10 < 6 THEN '{"amount":100,"currency":"EUR","reason":"deposit","balance_after":' || i || ',"metadata":{"note":"order ' || i || '"}}'
					WHEN i % 10 = 6 THEN '{"amount":10,"currency":"EUR","reason":"withdrawal","balance_after":' || i || '}'
					WHEN i % 10 = 7 THEN '{"amount":10,"currency":"EUR","reason":"refund","ref":"key-' || (i - 7) || '","balance_after":' || i || '}'
					ELSE '{"hold_id":"h-' || (i / 10) || '","amount":5,"currency":"EUR"}' END, 'UTF8'),
				'\x7b7d'
			FROM generate_series(0, $1::int - 1) i`, rows)
		mustExec(b, ctx, conn, `VACUUM ANALYZE events`)
		b.StartTimer()
		start := time.Now()
		if _, err := p.UpTo(ctx, 27); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		b.ReportMetric(d.Seconds(), "s/migration")
		b.ReportMetric(float64(rows)/d.Seconds(), "events/s")
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE subject IS NOT NULL`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n != rows/10*3 {
			b.Fatalf("%d events given a subject, want %d", n, rows/10*3)
		}
	}
}
