package ledger_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkKeyRecordHeap measures the live heap an account aggregate keeps per key
// it decided: one account with 100,000 deposits decided through the real handler
// over the memory store. "decided" is the aggregate as the handler built it;
// "loaded" is a fresh Service that read and folded the same stream (as after a
// restart), each event's strings its own copy as a store decoding from the wire
// gives them. The store's own share is measured apart (the heap with the store and
// without the Service) and left out. Run with
//
//	go test ./internal/ledger -run '^$' -bench KeyRecordHeap -benchtime 1x -count 3
func BenchmarkKeyRecordHeap(b *testing.B) {
	const keys = 100_000
	ctx := context.Background()
	clock := devtest.NewClock().Now
	// Every key kept (RecentKeys -1): the cost of one record, which the default
	// bound (1,024 recent keys) multiplies by at most 1,024.
	opts := ledger.Options{DisableGroupCommit: true, Clock: clock, RecentKeys: -1}
	for b.Loop() {
		store := memory.New()
		svc := ledger.New(store, opts)
		open := domain.Command{Type: domain.CmdOpenAccount, IdempotencyKey: "heap-open", AccountID: "heap", Currency: "EUR"}
		if r := svc.Handle(ctx, open); r.Status != domain.StatusApplied {
			b.Fatalf("open: %+v", r)
		}
		first := domain.Command{}
		for i := range keys {
			body := fmt.Appendf(nil, `{"idempotency_key":"%08x-5e1f-4c3a-9d2b-%012x","account_id":"heap","amount":%d,"currency":"EUR"}`, i, i, 100+i%1000)
			cmd, ierr := domain.DecodeCommand(domain.CmdDeposit, body)
			if ierr != nil {
				b.Fatal(ierr)
			}
			if i == 0 {
				first = cmd
			}
			if r := svc.Handle(ctx, cmd); r.Status != domain.StatusApplied {
				b.Fatalf("deposit: %+v", r)
			}
		}
		svc.Close()
		withDecided := liveHeap()
		runtime.KeepAlive(svc)
		svc = nil
		storeOnly := liveHeap()

		loaded := ledger.New(decodingStore{store}, opts)
		if r := loaded.Handle(ctx, first); !r.Duplicate {
			b.Fatalf("reload: %+v", r)
		}
		withLoaded := liveHeap()
		runtime.KeepAlive(loaded)
		runtime.KeepAlive(store)
		b.ReportMetric(float64(withDecided-storeOnly)/keys, "decided-B/key")
		b.ReportMetric(float64(withLoaded-storeOnly)/keys, "loaded-B/key")
	}
}

// decodingStore is the memory store with every event read given strings of its
// own, as PostgreSQL or KurrentDB decode them.
type decodingStore struct{ *memory.Store }

func (s decodingStore) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, count int) ([]eventstore.RecordedEvent, error) {
	evs, err := s.Store.ReadStream(ctx, stream, from, dir, count)
	for i := range evs {
		evs[i].Stream, evs[i].Type = strings.Clone(evs[i].Stream), strings.Clone(evs[i].Type)
	}
	return evs, err
}

func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
