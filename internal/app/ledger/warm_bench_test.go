package ledger_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkWarmedAccountHeap measures the live heap a warmed account costs
// the ledger (warm.go): 20,000 accounts opened and given one deposit each (a
// customer's account touched once: two keys) through the real handler over
// the memory store, then a fresh Service warms them all; the heap with the
// store alone is left out. It reports the measured bytes per account beside
// the cache's estimate of them (domain.Account.ApproxBytes), which is what
// --cache-memory-mib bounds. Run with
//
//	go test ./internal/app/ledger -run '^$' -bench WarmedAccountHeap -benchtime 1x -count 3
func BenchmarkWarmedAccountHeap(b *testing.B) {
	const accounts = 20_000
	clock := devtest.NewClock().Now
	for b.Loop() {
		store := customers(b, accounts)
		base := liveHeap()
		svc := ledger.New(store, ledger.Options{Clock: clock, CacheSize: 2 * accounts, CacheBytes: -1, WarmAccounts: accounts})
		var warmed int64
		devtest.Eventually(b, 5*time.Minute, "warming ends", func() bool {
			var done bool
			warmed, done = svc.Warming()
			return done
		})
		if warmed != accounts {
			b.Fatalf("%d accounts warmed, want %d", warmed, accounts)
		}
		held := liveHeap() - base
		b.ReportMetric(float64(held)/float64(accounts), "bytes/account")
		b.ReportMetric(float64(svc.CachedBytes())/accounts, "estimated-bytes/account")
		runtime.KeepAlive(svc)
		svc.Close()
	}
}

// customers is a memory store of n accounts opened and given one deposit each
// (a customer's account touched once: two keys) through the real handler.
func customers(b *testing.B, n int) *memory.Store {
	ctx := context.Background()
	store := memory.New()
	seed := ledger.New(store, ledger.Options{Clock: devtest.NewClock().Now, CacheSize: 1000, ResidentAccounts: -1})
	defer seed.Close()
	for i := range n {
		id := fmt.Sprintf("cust-%07d", i)
		for _, c := range []domain.Command{
			{Type: domain.CmdOpenAccount, IdempotencyKey: "open-" + id, AccountID: id, Currency: "EUR"},
			{Type: domain.CmdDeposit, IdempotencyKey: "dep-" + id, AccountID: id, Amount: 100, Currency: "EUR"},
		} {
			if r := seed.Handle(ctx, c); r.Status != domain.StatusApplied {
				b.Fatalf("%s %s: %+v", c.Type, id, r)
			}
		}
	}
	return store
}

// BenchmarkResidentAccountHeap measures the live heap a resident account
// costs the ledger (residents.go): as BenchmarkWarmedAccountHeap, 20,000
// accounts opened and given one deposit each, then a fresh Service whose
// cache holds one aggregate warms them all as residents (the table of them,
// the names, the compact states); the heap with the store alone is left out.
// It reports too the heap the garbage collector scans for pointers per
// resident (runtime/metrics /gc/scan/heap:bytes, after a collection): what
// each collection's marking reads for them. Run with
//
//	go test ./internal/app/ledger -run '^$' -bench ResidentAccountHeap -benchtime 1x -count 3
//
// LEDGER_BENCH_RESIDENT_ACCOUNTS sets the accounts (default 20,000): the
// table's pages are allocated whole, so that the figure at 20,000 carries
// their unused part.
func BenchmarkResidentAccountHeap(b *testing.B) {
	accounts := devtest.BenchEnv("LEDGER_BENCH_RESIDENT_ACCOUNTS", 20_000)
	clock := devtest.NewClock().Now
	for b.Loop() {
		store := customers(b, accounts)
		base, baseScan := liveHeap(), scannableHeap()
		svc := ledger.New(store, ledger.Options{Clock: clock, CacheSize: 1, WarmAccounts: accounts})
		devtest.Eventually(b, 5*time.Minute, "warming ends", func() bool {
			_, done := svc.Warming()
			return done
		})
		if n := svc.Residents(); n != accounts {
			b.Fatalf("%d accounts resident, want %d", n, accounts)
		}
		held, scanned := liveHeap()-base, scannableHeap()-baseScan
		b.ReportMetric(float64(held)/float64(accounts), "bytes/account")
		b.ReportMetric(float64(scanned)/float64(accounts), "scan-bytes/account")
		runtime.KeepAlive(svc)
		svc.Close()
	}
}

// scannableHeap is the heap the garbage collector scans for pointers, after
// a collection (liveHeap).
func scannableHeap() int64 {
	liveHeap()
	s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// BenchmarkWarmingOnPostgres measures how fast a restarted ledger warms the
// accounts of a PostgreSQL event store (warm.go): LEDGER_BENCH_WARM_ACCOUNTS
// accounts (default 100,000) opened in the store by bulk load
// (seed.OpenAccounts), then a fresh Service warms them all, timed from New
// to the end of warming, with the live heap it then holds per account. Run
// with
//
//	go test ./internal/app/ledger -run '^$' -bench WarmingOnPostgres -benchtime 1x
func BenchmarkWarmingOnPostgres(b *testing.B) {
	accounts := devtest.BenchEnv("LEDGER_BENCH_WARM_ACCOUNTS", 100_000)
	ctx := context.Background()
	store := devtest.Postgres(b)
	body := func(i int) []byte {
		return fmt.Appendf(nil, `{"idempotency_key":"open-wp%07d","account_id":"wp%07d","currency":"EUR"}`, i, i)
	}
	if err := seed.OpenAccounts(ctx, store, accounts, seed.OpenOptions{Body: body}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		base := liveHeap()
		start := time.Now()
		svc := ledger.New(store, ledger.Options{CacheSize: 2 * accounts, CacheBytes: -1, WarmAccounts: accounts})
		var warmed int64
		devtest.Eventually(b, 30*time.Minute, "warming ends", func() bool {
			var done bool
			warmed, done = svc.Warming()
			return done
		})
		took := time.Since(start)
		if warmed != int64(accounts) {
			b.Fatalf("%d accounts warmed, want %d", warmed, accounts)
		}
		b.ReportMetric(float64(accounts)/took.Seconds(), "accounts/s")
		b.ReportMetric(float64(liveHeap()-base)/float64(accounts), "bytes/account")
		runtime.KeepAlive(svc)
		svc.Close()
	}
}
