package ledger_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
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
		b.ReportMetric(float64(held)/accounts, "bytes/account")
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
// cache holds one aggregate warms them all as residents (the map of them by
// stream name, the names, the compact states); the heap with the store alone
// is left out. Run with
//
//	go test ./internal/app/ledger -run '^$' -bench ResidentAccountHeap -benchtime 1x -count 3
func BenchmarkResidentAccountHeap(b *testing.B) {
	const accounts = 20_000
	clock := devtest.NewClock().Now
	for b.Loop() {
		store := customers(b, accounts)
		base := liveHeap()
		svc := ledger.New(store, ledger.Options{Clock: clock, CacheSize: 1, WarmAccounts: accounts})
		devtest.Eventually(b, 5*time.Minute, "warming ends", func() bool {
			_, done := svc.Warming()
			return done
		})
		if n := svc.Residents(); n != accounts {
			b.Fatalf("%d accounts resident, want %d", n, accounts)
		}
		held := liveHeap() - base
		b.ReportMetric(float64(held)/accounts, "bytes/account")
		runtime.KeepAlive(svc)
		svc.Close()
	}
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
	accounts := 100_000
	if v := os.Getenv("LEDGER_BENCH_WARM_ACCOUNTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("LEDGER_BENCH_WARM_ACCOUNTS=%q: want a positive number", v)
		}
		accounts = n
	}
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
