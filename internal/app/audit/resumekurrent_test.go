package audit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestStoppedAuditResumedOnKurrentDB: on a KurrentDB store (transfers and
// transactions run as sagas) with PostgreSQL sets and read models, a full
// audit stopped by its context at every other page's end (some among sagas
// in flight) stores a stop point, and its resume equals one run through:
// the same report, the same checkpoint stored (state and account rows), no
// stop point nor run schema left. The store has no duplicate-ID query, so
// the event IDs are the run's audit_ids set, carried across the stop.
func TestStoppedAuditResumedOnKurrentDB(t *testing.T) {
	st := devtest.KurrentDB(t)
	env := projtest.New(t)
	env.Ledger = ledger.New(st, ledger.Options{})
	env.Run(t, projtest.Workload{Commands: 80, Seed: 11})
	r, err := projections.NewRunner(env.Pool, st, projections.Options{BatchSize: 37})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	opts := audit.Options{BatchSize: 7, VerifyChain: true, SaveCheckpoint: true}
	through := runOn(t, env, st, opts)
	if !through.OK() || through.Checkpoint == nil {
		t.Fatalf("the run through: checkpoint %+v, %v", through.Checkpoint, through.Violations)
	}
	prev := through.Checkpoint.ID
	for pages := int64(2); pages*7 < through.Events; pages += 2 {
		prev = resumedOnKurrentDB(t, env, st, opts, pages, through, prev)
	}
	if s := runSchemas(t, env.Pool); len(s) != 0 {
		t.Fatalf("run schemas after the resume: %v", s)
	}
}

// resumedOnKurrentDB stops an audit of st at the end of its page pages,
// resumes it, checks it against through and that it stored the checkpoint
// prev is (the same state and account rows), and returns its checkpoint.
func resumedOnKurrentDB(t *testing.T, env *projtest.Env, st audit.Store, opts audit.Options, pages int64, through *audit.Report, prev int64) int64 {
	t.Helper()
	stop := stopAtOn(t, env, st, opts, int(pages))
	if stop.Events <= (pages-1)*int64(opts.BatchSize) || stop.Events >= through.Events {
		t.Fatalf("stopped after %d events, not at page %d's end before the head (%d)", stop.Events, pages, through.Events)
	}
	opts.Resume, opts.ExpectDigest = true, stop.Digest
	resumed := runOn(t, env, st, opts)
	if resumed.Resumed == nil || *resumed.Resumed != *stop {
		t.Fatalf("resumed from %+v, want %+v", resumed.Resumed, stop)
	}
	if a, b := comparable(t, through), comparable(t, resumed); a != b {
		t.Fatalf("stopped at page %d, resumed:\n%s\nrun through:\n%s", pages, b, a)
	}
	if resumed.Checkpoint == nil {
		t.Fatalf("the resumed clean audit stored no checkpoint: %s", resumed.NoCheckpoint)
	}
	sameCheckpoints(t, env, prev, resumed.Checkpoint.ID)
	if _, err := projections.Checkpoints.LoadAuditStop(context.Background(), env.Pool); !errors.Is(err, projections.ErrNoAuditStop) {
		t.Fatalf("the stop point after the resume: %v", err)
	}
	return resumed.Checkpoint.ID
}
