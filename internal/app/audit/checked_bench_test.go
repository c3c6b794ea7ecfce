package audit

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// BenchmarkCheckedRecords has the fold check a snapshot of each of 10,000
// accounts (each its own bytes, as read from the store, with 10 closed holds
// and 10 refunded originals: some 3.2 KB) and reports the heap the record of
// the checked snapshots keeps after a GC (Fold.checked, what the checkpoint
// the audit stores records), per account: retained-B/account.
//
//	go test ./internal/app/audit -run '^$' -bench CheckedRecords -benchtime 1x -count 3
func BenchmarkCheckedRecords(b *testing.B) {
	const accounts, recent = 10_000, 10
	streams := make([]string, accounts)
	snaps := make([]*domain.Account, accounts)
	exp := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range streams {
		a := domain.NewAccount(fmt.Sprintf("0b7e1c2a-4a8e-4f55-9a4e-%012d", i))
		a.Opened, a.Currency, a.Revision = true, "EUR", 5000
		for j := 0; j < recent; j++ {
			id := fmt.Sprintf("hold-%08d-4a8e-4f55-9a4e-2f1d3c4b5a69", j)
			a.SetHold(&domain.Hold{ID: id, Amount: 123456, Status: domain.HoldStatusCaptured, Key: "key-" + id, Findable: true, ExpiresAt: exp})
			a.SetRefunded(fmt.Sprintf("orig-%08d-4a8e-4f55-9a4e-2f1d3c4b5a69", j), domain.RefundedSum{Amount: 1000, Findable: true})
		}
		streams[i], snaps[i] = domain.AccountStream(a.ID), a
	}
	var retained, size float64
	for b.Loop() {
		f := NewFold()
		size = 0
		f.sets = noSets{}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i, stream := range streams {
			data, err := domain.EncodeSnapshot(stream, snaps[i])
			if err != nil {
				b.Fatal(err)
			}
			size += float64(len(data)) / accounts
			f.snapshots = map[string]snapshotCheck{stream: {revision: 5000, acc: snaps[i], data: data}}
			f.checkSnapshot(stream, snaps[i], eventstore.Position{})
		}
		f.snapshots = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		if len(f.checked) != accounts || len(f.Violations) != 0 {
			b.Fatalf("%d recorded of %d: %v", len(f.checked), accounts, f.Violations)
		}
		retained = float64(after.HeapAlloc-before.HeapAlloc) / accounts
		runtime.KeepAlive(f)
	}
	b.ReportMetric(retained, "retained-B/account")
	b.ReportMetric(size, "snapshot-B")
}
