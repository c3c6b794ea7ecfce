package seed_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/heaptest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// historyKinds are the kinds of event a seeded history must hold, one for
// each of its units' outcomes: "type" or "type/reason".
var historyKinds = []string{
	domain.EvAccountOpened, domain.EvKeyClaimed, domain.EvCommandRejected,
	"Credited/" + domain.ReasonDeposit, "Debited/" + domain.ReasonWithdrawal,
	"Debited/" + domain.ReasonTransferOut, "Credited/" + domain.ReasonTransferIn,
	"Debited/" + domain.ReasonTransactionOut, "Credited/" + domain.ReasonTransactionIn,
	domain.EvHoldPlaced, domain.EvHoldCaptured, "Credited/" + domain.ReasonCaptureIn, domain.EvHoldReleased,
	"Debited/" + domain.ReasonRefund,
}

// kindsOf counts the events of a store by kind (see historyKinds), and checks
// that positions increase along every stream with its revisions.
func kindsOf(t *testing.T, st eventstore.AllReader) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	heads := map[string]eventstore.RecordedEvent{}
	for _, re := range devtest.ReadAll(t, st) {
		if prev, ok := heads[re.Stream]; ok && (re.Revision != prev.Revision+1 || re.Position.Compare(prev.Position) <= 0) {
			t.Fatalf("%s: revision %d at %s follows revision %d at %s", re.Stream, re.Revision, re.Position, prev.Revision, prev.Position)
		}
		heads[re.Stream] = re
		kind := re.Type
		switch e, _ := domain.DecodeEvent(re.Type, re.Data); e := e.(type) {
		case *domain.Credited:
			kind += "/" + e.Reason
		case *domain.Debited:
			kind += "/" + e.Reason
		}
		kinds[kind]++
	}
	return kinds
}

// TestHistoryLoaded: a history seeded in chunks by bulk loads, snapshots
// taken every 40 events of an account, holds every unit kind's events, its
// streams in order, and is what the ledger writes: every projection rebuilt
// from it passes the rebuild's check, and the audit (every invariant, the
// chain verified, the read models compared, the snapshots checked) finds
// nothing.
func TestHistoryLoaded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := projtest.New(t)
	dst := &snapWatch{Store: env.Store, latest: map[string]uint64{}}
	var loads []int64
	res, err := seed.History(ctx, dst, 20_000, seed.HistoryOptions{Accounts: 200, Chunk: 3000, SnapshotEvery: 40,
		Loaded: func(events int64) { loads = append(loads, events) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events < 20_000 || res.Rejected == 0 || len(loads) < 6 || loads[len(loads)-1] != res.Events {
		t.Fatalf("seeded %+v in loads ending at %v", res, loads)
	}
	kinds := kindsOf(t, env.Store)
	var total int
	for _, k := range kinds {
		total += k
	}
	for _, k := range historyKinds {
		if kinds[k] == 0 {
			t.Errorf("no %s among the history's events: %v", k, kinds)
		}
	}
	if int64(total) != res.Events {
		t.Errorf("the store holds %d events, the seeder says it loaded %d", total, res.Events)
	}
	if _, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{Check: audit.VerifyGeneration(env.Pool, env.Store)}); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Run(ctx, env.Store, audit.Options{ReadModels: env.Pool, VerifyChain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Events != res.Events {
		t.Fatalf("audit of %d events, %d snapshots checked: %d violations %v", rep.Events, rep.Snapshots, rep.ViolationCount, rep.Violations)
	}
	dst.check(ctx, t, res.Snapshots, rep.Snapshots)
	t.Logf("%+v in %d loads; %d snapshots; kinds %v", res, len(loads), rep.Snapshots, kinds)
}

// snapWatch is the PostgreSQL store, watching the snapshots written to it.
type snapWatch struct {
	*postgres.Store
	mu      sync.Mutex
	written int64
	latest  map[string]uint64 // each stream's latest revision written
}

func (w *snapWatch) WriteSnapshot(ctx context.Context, s eventstore.Snapshot) error {
	w.mu.Lock()
	w.written++
	w.latest[s.Stream] = max(w.latest[s.Stream], s.Revision)
	w.mu.Unlock()
	return w.Store.WriteSnapshot(ctx, s)
}

// check: every snapshot the seeder's service took (taken) was written to the
// store, the store holds each stream's latest of them and no other, and the
// audit checked exactly those.
func (w *snapWatch) check(ctx context.Context, t *testing.T, taken int64, checked int) {
	t.Helper()
	stored, err := w.Store.ReadSnapshots(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if taken == 0 || w.written != taken || len(stored) != len(w.latest) || checked != len(stored) {
		t.Fatalf("snapshots: %d taken, %d written to the store over %d streams, %d stored, %d checked by the audit", taken, w.written, len(w.latest), len(stored), checked)
	}
	for _, s := range stored {
		if rev, ok := w.latest[s.Stream]; !ok || rev != s.Revision {
			t.Errorf("%s's snapshot stored at revision %d, its latest written at %d", s.Stream, s.Revision, rev)
		}
	}
}

// dropping is the PostgreSQL store, but that its Nth Load loses one event:
// a broken seeder.
type dropping struct {
	*postgres.Store
	load, n int
	dropped eventstore.EventData
	stream  string
}

func (d *dropping) Load(ctx context.Context, parts []eventstore.StreamAppend) error {
	if d.load++; d.load == d.n {
		for i, p := range parts {
			if strings.HasPrefix(p.Stream, domain.AccountStreamPrefix) && len(p.Events) == 1 && i > len(parts)/2 {
				d.dropped, d.stream = p.Events[0], p.Stream
				parts = append(parts[:i:i], parts[i+1:]...)
				break
			}
		}
	}
	return d.Store.Load(ctx, parts)
}

// TestHistoryLoadedDropAudited: a seeder that loses one account event from a
// chunk leaves a history the audit refuses with a revision gap (invariant 5,
// revision_gap) on that stream: the events after the one lost keep their
// revisions.
func TestHistoryLoadedDropAudited(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := projtest.New(t)
	dst := &dropping{Store: env.Store, n: 2}
	if _, err := seed.History(ctx, dst, 6000, seed.HistoryOptions{Accounts: 50, Chunk: 2000}); err != nil {
		t.Fatal(err)
	}
	if dst.stream == "" {
		t.Fatal("no event dropped")
	}
	rep, err := audit.Run(ctx, env.Store, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gap := false
	for _, v := range rep.Violations {
		gap = gap || v.Stream == dst.stream && v.Invariant == audit.InvStreams && v.Kind == "revision_gap"
	}
	if !gap {
		t.Fatalf("the audit after %s's %s %s was dropped: %d violations %v", dst.stream, dst.dropped.Type, dst.dropped.ID, rep.ViolationCount, rep.Violations)
	}
	t.Logf("%s's %s dropped: %v", dst.stream, dst.dropped.Type, rep.Violations[0])
}

// TestHistoryHeapBounded: the seeder's live heap does not grow with the
// history. Over the same 2,000 accounts, the heap live after a forced
// collection as a chunk is loaded grows by under heapPerEvent bytes an event
// between about N and 4N events (N = 12,000; the accounts' openings are 4,000
// of them). The seeder's state is per account: each account's aggregate with
// one key record, one closed hold and one refunded original kept
// (historyRecent), and the service's claim and transfer caches (the accounts
// plus OpenBatch entries each), which are still filling there: measured 79-91
// bytes an event. The seeder that kept 16 key records and 1,024 closed holds
// and refunded originals an account grew 202-250 bytes an event here (its key
// records filling), and fails.
func TestHistoryHeapBounded(t *testing.T) {
	const (
		heapPerEvent   = 128
		accounts, n, m = 2000, 12_000, 48_000
		chunk          = 2000
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var at []heapAt
	_, err := seed.History(ctx, devtest.Postgres(t), m, seed.HistoryOptions{Accounts: accounts, Chunk: chunk,
		Loaded: func(events int64) { at = append(at, heapAt{events, heaptest.Live()}) }})
	if err != nil {
		t.Fatal(err)
	}
	// The last load's heap is the seeder's after its service closed, without
	// a chunk: it is not compared.
	at = at[:len(at)-1]
	first := at[slices.IndexFunc(at, func(h heapAt) bool { return h.events >= n })]
	last := at[len(at)-1]
	grew := (float64(last.heap) - float64(first.heap)) / float64(last.events-first.events)
	t.Logf("live heap %.2f MiB at %d events, %.2f MiB at %d: %.1f bytes per added event", mib(first.heap), first.events, mib(last.heap), last.events, grew)
	if last.events < 3*n || grew >= heapPerEvent {
		t.Fatalf("the live heap grew with the events: %.1f bytes per event from %d to %d (%.2f to %.2f MiB)", grew, first.events, last.events, mib(first.heap), mib(last.heap))
	}
}

// heapAt is the live heap when a history had so many events loaded.
type heapAt struct {
	events int64
	heap   uint64
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
