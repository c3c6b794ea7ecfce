package audit_test

import (
	"context"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAuditChecksConditions: the workload's sweeps (withdrawals and transfers
// with up_to) and conditional writes (expected_revision, some of them stale)
// pass the audit, read models included; a sweep whose event says it moved more
// than it asked, and a refusal of a command whose expected revision was the
// account's yet is not revision_mismatch, are each named (PROTOCOL.md v1.2 §2.3).
func TestAuditChecksConditions(t *testing.T) {
	for _, c := range []struct {
		name, kind, plant string
	}{
		{"a sweep that moved more than it asked", "sweep_mismatch", `UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')::jsonb, '{requested}',
			to_jsonb((convert_from(data, 'UTF8')::jsonb->>'amount')::bigint - 1))::text, 'UTF8')
			WHERE position = (SELECT min(position) FROM events WHERE type = 'Debited' AND convert_from(data, 'UTF8')::jsonb ? 'requested')`},
		{"a revision mismatch recorded as another refusal", "revision_condition", `UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')::jsonb, '{code}', '"insufficient_funds"')::text, 'UTF8')
			WHERE position = (SELECT min(position) FROM events WHERE type = 'CommandRejected' AND convert_from(data, 'UTF8')::jsonb->>'code' = 'revision_mismatch')`},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := projected(t, projtest.Workload{Commands: 200, Seed: 12})
			ctx := context.Background()
			var sweeps, partial, mismatches, conditional int
			if err := env.Pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE type = 'Debited' AND d ? 'requested'),
				count(*) FILTER (WHERE type = 'Debited' AND (d->>'requested')::bigint > (d->>'amount')::bigint),
				count(*) FILTER (WHERE type = 'CommandRejected' AND d->>'code' = 'revision_mismatch'),
				count(*) FILTER (WHERE position(convert_to('"expected_revision"', 'UTF8') in decode(convert_from(metadata, 'UTF8')::jsonb->>'request', 'base64')) > 0)
				FROM (SELECT type, metadata, convert_from(data, 'UTF8')::jsonb AS d FROM events) e`).Scan(&sweeps, &partial, &mismatches, &conditional); err != nil {
				t.Fatal(err)
			}
			if sweeps == 0 || partial == 0 || mismatches == 0 || conditional <= mismatches {
				t.Fatalf("the workload has %d sweeps (%d partial), %d conditional commands, %d revision mismatches", sweeps, partial, conditional, mismatches)
			}
			if rep := run(t, env, audit.Options{}); !rep.OK() {
				t.Fatalf("violations before the corruption: %v", rep.Violations)
			}
			exec(t, env, c.plant)
			if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvBalance, c.kind) {
				t.Fatalf("%s was not named %s: %v", c.name, c.kind, rep.Violations)
			}
		})
	}
}
