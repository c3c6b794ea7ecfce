package projections_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// alteringCheck is a Check that alters the commands generation it is to
// verify before it verifies it (stmt: %s the generation's command_accounts).
type alteringCheck struct {
	projections.Check
	t    *testing.T
	exec func(ctx context.Context, sql string) (int64, error)
	stmt string
}

func (c *alteringCheck) Verify(ctx context.Context, vs []projections.Verification) ([]error, error) {
	for _, v := range vs {
		if v.Projection != projections.Commands {
			continue
		}
		n, err := c.exec(ctx, fmt.Sprintf(c.stmt, projections.Table("command_accounts", v.Generation)))
		if err != nil || n != 1 {
			c.t.Errorf("altering command_accounts: %d rows, %v", n, err)
		}
	}
	return c.Check.Verify(ctx, vs)
}

// TestRebuildRefusesAWrongCommandAccounts: a rebuild whose new generation of
// command_accounts (the commands projection's own fold of the accounts)
// differs from the fold of the store does not switch the commands read
// model: a wrong balance, held amount, revision (behind or ahead) or
// currency, a missing row and an extra one are each refused, the other
// projections switching.
func TestRebuildRefusesAWrongCommandAccounts(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 150, Seed: 52})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := projtest.Snapshot(t, env.Pool)
	for _, c := range []struct{ name, stmt, named string }{
		{"a balance off by one", `UPDATE %s SET balance = balance + 1 WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"a held amount off by one", `UPDATE %s SET held = held + 1 WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"a revision behind", `UPDATE %s SET revision = revision - 1 WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"a revision ahead", `UPDATE %s SET revision = revision + 1 WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"a currency wrong", `UPDATE %s SET currency = 'XXX' WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"a missing row", `DELETE FROM %s WHERE account_id = 'w-acct-2'`, "w-acct-2"},
		{"an extra row", `INSERT INTO %s (account_id, currency, balance, held, revision) SELECT 'phantom', currency, balance, held, revision FROM %[1]s WHERE account_id = 'w-acct-2'`, "phantom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := liveGenerations(t, env)
			check := &alteringCheck{Check: audit.VerifyGeneration(env.Pool, env.Store), t: t, stmt: c.stmt,
				exec: func(ctx context.Context, sql string) (int64, error) {
					ct, err := env.Pool.Exec(ctx, sql)
					return ct.RowsAffected(), err
				}}
			_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 30, Check: check})
			if !errors.Is(err, audit.ErrGenerationMismatch) || !strings.Contains(err.Error(), "command_accounts") || !strings.Contains(err.Error(), `"`+c.named+`"`) {
				t.Fatalf("the rebuild took a wrong command_accounts: %v", err)
			}
			t.Log(err)
			after := liveGenerations(t, env)
			if after[projections.Commands] != before[projections.Commands] || after[projections.Accounts] == before[projections.Accounts] {
				t.Fatalf("generations before %v, after %v: commands switched, or accounts did not", before, after)
			}
			projtest.SameSnapshot(t, "read models after a refused rebuild", live, projtest.Snapshot(t, env.Pool))
		})
	}
	projtest.AuditOK(t, env.Store, env.Pool)
}
