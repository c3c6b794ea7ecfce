package client_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// benchCallers is the concurrency of BenchmarkConcurrentDeposits.
const benchCallers = 64

// BenchmarkConcurrentDeposits: 64 goroutines each calling Deposit in a loop,
// b.N deposits in all, against a ledger on PostgreSQL, first with one
// request per command (WithoutBatching), then with the automatic batching
// (default linger), in the same run; it reports both rates and their ratio.
// BENCHMARKS.md has the command and the figures.
func BenchmarkConcurrentDeposits(b *testing.B) {
	run := depositors(b)
	b.ResetTimer()
	alone := run("alone", client.WithoutBatching())
	batched := run("batched")
	b.StopTimer()
	b.ReportMetric(alone, "alone-cmd/s")
	b.ReportMetric(batched, "batched-cmd/s")
	b.ReportMetric(batched/alone, "batched/alone")
}

// BenchmarkDepositsOnePerRequest is BenchmarkConcurrentDeposits' first half
// alone in its process, for a CPU profile of it.
func BenchmarkDepositsOnePerRequest(b *testing.B) {
	run := depositors(b)
	b.ResetTimer()
	b.ReportMetric(run("alone", client.WithoutBatching()), "cmd/s")
}

// BenchmarkDepositsBatched is its second half alone, for a CPU profile.
func BenchmarkDepositsBatched(b *testing.B) {
	run := depositors(b)
	b.ResetTimer()
	b.ReportMetric(run("batched"), "cmd/s")
}

// depositors starts the ledger and opens benchCallers accounts; run makes b.N
// deposits from benchCallers goroutines, one account each, through a client
// with opts, and returns the rate.
func depositors(b *testing.B) (run func(name string, opts ...client.Option) float64) {
	ns := devtest.NATS(b)
	ledgerOn(b, ns, devtest.Postgres(b), "")
	setup := client.New(devtest.Connect(b, ns))
	for i := range benchCallers {
		open(b, setup, fmt.Sprintf("bench-%02d", i), 0)
	}
	return func(name string, opts ...client.Option) float64 {
		c := client.New(devtest.Connect(b, ns), opts...)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for g := range benchCallers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for {
					i := next.Add(1)
					if i > int64(b.N) {
						return
					}
					r, err := c.Deposit(ctx, client.Deposit{Key: fmt.Sprintf("%s-%d-%d", name, b.N, i), AccountID: fmt.Sprintf("bench-%02d", g), Amount: 1, Currency: "EUR"})
					if err != nil || r.Status != client.StatusApplied {
						b.Errorf("%s deposit %d: %+v %v", name, i, r, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		rate := float64(b.N) / time.Since(start).Seconds()
		b.StopTimer()
		capturedDecided(b, ns)
		b.StartTimer()
		return rate
	}
}

// capturedDecided waits until the ledger's JetStream consumer has confirmed
// every command LEDGER_COMMANDS captured (after its grace), so that a phase
// does not pay for the one before it.
func capturedDecided(b *testing.B, ns *server.Server) {
	js, err := jetstream.New(devtest.Connect(b, ns))
	if err != nil {
		b.Fatal(err)
	}
	devtest.Eventually(b, 5*time.Minute, "the captured commands confirmed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, natsapi.StreamName, natsapi.DefaultDurable)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// BenchmarkLoneCaller: one goroutine calling Deposit in a loop, with and
// without the automatic batching: what the linger costs a caller alone (a
// call made while nothing is in flight is sent at once). It reports the
// median and p99 latency of each.
func BenchmarkLoneCaller(b *testing.B) {
	ns := devtest.NATS(b)
	ledgerOn(b, ns, devtest.Postgres(b), "")
	setup := client.New(devtest.Connect(b, ns))
	open(b, setup, "lone", 0)
	run := func(name string, opts ...client.Option) (p50, p99 time.Duration) {
		c := client.New(devtest.Connect(b, ns), opts...)
		lats := make([]time.Duration, 0, b.N)
		for i := range b.N {
			t0 := time.Now()
			r, err := c.Deposit(context.Background(), client.Deposit{Key: fmt.Sprintf("lone-%s-%d-%d", name, b.N, i), AccountID: "lone", Amount: 1, Currency: "EUR"})
			if err != nil || r.Status != client.StatusApplied {
				b.Fatalf("%s deposit %d: %+v %v", name, i, r, err)
			}
			lats = append(lats, time.Since(t0))
		}
		sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
		return lats[len(lats)/2], lats[len(lats)*99/100]
	}
	b.ResetTimer()
	a50, a99 := run("alone", client.WithoutBatching())
	l50, l99 := run("batched")
	b.StopTimer()
	b.ReportMetric(float64(a50.Microseconds()), "alone-p50-µs")
	b.ReportMetric(float64(a99.Microseconds()), "alone-p99-µs")
	b.ReportMetric(float64(l50.Microseconds()), "batched-p50-µs")
	b.ReportMetric(float64(l99.Microseconds()), "batched-p99-µs")
}
