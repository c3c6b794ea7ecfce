package audit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// stopInRead is a PostgreSQL store that, once armed, ends the audit's
// context (stop) as the fold reads a snapshot again: a stop (SIGTERM) that
// lands while the fold is in a page, not at its end.
type stopInRead struct {
	*postgres.Store
	stop         context.CancelFunc
	armed, fired atomic.Bool
}

func (s *stopInRead) ReadSnapshot(ctx context.Context, stream string) (eventstore.Snapshot, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.stop()
		s.fired.Store(true)
	}
	return s.Store.ReadSnapshot(ctx, stream)
}

// TestStopInAPageStoresItsStopPoint: a full audit whose context ends while
// its fold reads mid-page (a snapshot read again as the fold reaches it)
// finishes that page, stores its stop point at the page's end, and the
// resume equals one run through. Before, the read failed with the stop, the
// page did not end, and the audit stored no stop point (ErrStopped, no
// Report.Stop): a SIGTERM lost every page folded (found by
// TestAuditStoppedBySIGTERMAndResumed in cmd/ledger, flaky: its signal lands
// in the page after the one whose COPY it waits on).
func TestStopInAPageStoresItsStopPoint(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	snapshotEveryAccount(t, env)
	opts := audit.Options{BatchSize: 7, VerifyChain: true, Sets: env.Pool}
	through := run(t, env, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &stopInRead{Store: env.Store, stop: cancel}
	pages := 0
	stopped := opts
	stopped.ReadModels = env.Pool
	stopped.Progress = func(int64, int64) {
		if pages++; pages == 1 {
			st.armed.Store(true)
		}
	}
	rep, err := audit.Run(ctx, st, stopped)
	if !st.fired.Load() {
		t.Fatalf("no snapshot read after the first page: the stop did not land in a page (%v)", err)
	}
	if !errors.Is(err, audit.ErrStopped) || !errors.Is(err, context.Canceled) || rep == nil || rep.Stop == nil {
		t.Fatalf("stopped in page %d: %v, report %+v: no stop point stored", pages, err, rep)
	}
	if stop := rep.Stop; stop.Events != int64(pages*opts.BatchSize) || stop.Events >= through.Events {
		t.Fatalf("stopped after %d events, want the end of the page the stop landed in (%d of %d pages of %d), before the head (%d)",
			stop.Events, pages, pages, opts.BatchSize, through.Events)
	}
	opts.Resume, opts.ExpectDigest = true, rep.Stop.Digest
	resumed := run(t, env, opts)
	if a, b := comparable(t, through), comparable(t, resumed); a != b {
		t.Fatalf("stopped in a page, resumed:\n%s\nrun through:\n%s", b, a)
	}
}
