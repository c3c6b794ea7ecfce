package audit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestAResumeStoppedInItsEndChecksLeavesNothingBehind (from the second
// review of the resume's fixes): a resume stopped after its fold, in its end
// checks, stores no stop point and has copied the rows after the one it
// resumed into that run's sets, so the stop point no longer matches them and
// no audit can resume it. The next resume refuses it (start over) and drops
// it and its schema under the run's lock: before, every resume refused it
// and no audit ever dropped it or its schema (a plain audit keeps the schema
// a stop point names), the whole history's sets left on the database.
func TestAResumeStoppedInItsEndChecksLeavesNothingBehind(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	opts := audit.Options{BatchSize: 7}
	stopAt(t, env, opts, 3)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := audit.Run(ctx, env.Store, audit.Options{BatchSize: 7, ReadModels: env.Pool, Sets: env.Pool, Resume: true,
		SaveCheckpoint: true, SnapshotsListedAgain: cancel})
	cancel()
	if err == nil {
		t.Fatal("the resume was not stopped in its end checks")
	}
	_, err = audit.Run(context.Background(), env.Store, audit.Options{BatchSize: 7, ReadModels: env.Pool, Sets: env.Pool, Resume: true})
	if !errors.Is(err, audit.ErrStartOver) {
		t.Fatalf("the resume of a stop point whose sets went on past it: %v, want start over", err)
	}
	var stops int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM readmodel.audit_checkpoints WHERE kind = 'stop'`).Scan(&stops); err != nil {
		t.Fatal(err)
	}
	if s := runSchemas(t, env.Pool); stops > 0 || len(s) > 0 {
		t.Fatalf("after the refusal: %d stop point(s) and run schemas %v left", stops, s)
	}
	if rep := run(t, env, opts); !rep.OK() {
		t.Fatalf("the full audit after: %v", rep.Violations)
	}
}
