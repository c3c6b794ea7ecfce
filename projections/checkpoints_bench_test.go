package projections

import (
	"context"
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkAuditCheckpointDigest: what binding a checkpoint's account rows
// costs at LEDGER_BENCH_ACCOUNTS rows (default 100,000; a 500-byte snapshot
// each, as the audit's): the sorted sha256 that SaveAudit writes and
// LoadAudit checks (auditRowsDigestSQL, migration 00017) against the 60-bit
// sum it replaces (00013's), each timed in the same run.
//
//	LEDGER_BENCH_ACCOUNTS=1000000 go test ./projections -run '^$' -bench AuditCheckpointDigest -benchtime 3x
func BenchmarkAuditCheckpointDigest(b *testing.B) {
	ctx := context.Background()
	pool, n := devtest.BenchAccounts(b)
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state) VALUES (0, 0, 0, '') RETURNING id`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO readmodel.audit_checkpoint_accounts (checkpoint_id, account_id, next, chain, group_key, group_next, group_count, guarded, snapshot)
		SELECT $1, 'acct-' || i, i, md5(i::text), '', 0, 0, false, convert_to(repeat(md5(i::text), 16), 'UTF8') FROM generate_series(1, $2) i`, id, n); err != nil {
		b.Fatal(err)
	}
	statements := map[string]string{
		"sha256": auditRowsDigestSQL("$1"),
		"sum60": `SELECT count(*), coalesce(sum(('x' || substr(md5(account_id || '/' || next || '/' || chain || '/' || group_key || '/' ||
			group_next || '/' || group_count || '/' || guarded || '/' || md5(snapshot)), 1, 15))::bit(60)::bigint), 0)::text
			FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1`,
	}
	devtest.TimeStatements(b, "sum60", []string{"sum60", "sha256"}, func(name string) error {
		var (
			rows   int64
			digest string
		)
		if err := pool.QueryRow(ctx, statements[name], id).Scan(&rows, &digest); err != nil || rows != int64(n) {
			return fmt.Errorf("%d rows of %d: %v", rows, n, err)
		}
		return nil
	})
}
