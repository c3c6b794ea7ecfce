package projections

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

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

// BenchmarkAuditSaveDelta: an incremental audit's save and the next load of
// what it stored, over a root of LEDGER_BENCH_ACCOUNTS accounts (default
// 50,000, BenchmarkAuditIncremental's at 10,000,000 events; a 500-byte
// snapshot each) of which LEDGER_BENCH_TOUCH_PERMILLE (default 632, the
// 31,620 of 50,000 that its last 1% touches) are handed: stored as a delta
// (migration 00030) against stored as a root that copies the others after
// rechecking the root's rows (CarryNoSnapshots: the save before 00030), in
// turn within each round; each stored checkpoint is dropped, untimed.
//
//	LEDGER_BENCH_ACCOUNTS=50000 go test ./projections -run '^$' -bench AuditSaveDelta -benchtime 3x
func BenchmarkAuditSaveDelta(b *testing.B) {
	ctx := context.Background()
	pool, n := devtest.BenchAccounts(b)
	if n == 100_000 && os.Getenv("LEDGER_BENCH_ACCOUNTS") == "" {
		n = 50_000
	}
	touched := n * devtest.BenchEnv("LEDGER_BENCH_TOUCH_PERMILLE", 632) / 1000
	state := AuditCheckpoint{State: []byte{}, AccountsTable: "0", ActiveHolds: "0"}
	rows := func(k, next int) func() (AuditAccount, bool, error) {
		i := 0
		return func() (AuditAccount, bool, error) {
			if i == k {
				return AuditAccount{}, false, nil
			}
			i++
			return AuditAccount{AccountID: fmt.Sprintf("acct-%d", i), Next: uint64(next), Chain: fmt.Sprint(i, next), Snapshot: []byte(strings.Repeat(fmt.Sprint(i), 500/len(fmt.Sprint(i))))}, true, nil
		}
	}
	root, err := Checkpoints.SaveAudit(ctx, pool, AuditSave{Checkpoint: state, Next: rows(n, 1), Rows: int64(n)})
	if err != nil {
		b.Fatal(err)
	}
	spent := map[bool]time.Duration{}
	loads := map[bool]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, copyAll := range []bool{true, false} {
			start := time.Now()
			cp, err := Checkpoints.SaveAudit(ctx, pool, AuditSave{Checkpoint: state, Next: rows(touched, 2), CarryFrom: root.ID, CarryNoSnapshots: copyAll, Rows: int64(n)})
			spent[copyAll] += time.Since(start)
			if err == nil {
				start = time.Now()
				_, err = Checkpoints.LoadAudit(ctx, pool, cp.ID)
				loads[copyAll] += time.Since(start)
			}
			if err == nil {
				_, err = pool.Exec(ctx, `DELETE FROM readmodel.audit_checkpoints WHERE id = $1`, cp.ID)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	runs := float64(b.N)
	b.ReportMetric(spent[true].Seconds()/runs, "root-save-s")
	b.ReportMetric(spent[false].Seconds()/runs, "delta-save-s")
	b.ReportMetric(spent[false].Seconds()/spent[true].Seconds(), "delta/root-save")
	b.ReportMetric(loads[true].Seconds()/runs, "root-load-s")
	b.ReportMetric(loads[false].Seconds()/runs, "delta-load-s")
}
