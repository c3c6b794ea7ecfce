package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/migrations"
)

// BenchmarkBatchesHotAndSpread is `ledger bench`'s two batch phases without
// NATS and its clients: each round, batchClients goroutines each hand
// HandleBatch a batch of batchSize new deposits (not atomic), all at once,
// on the PostgreSQL store with group commit; a spread round puts the
// commands on batchAccounts accounts, a hot round every one on one account;
// from the third round on, a tenth of them are resends (batchOfDeposits).
// The rounds alternate (spread, hot, spread, ...), so that a machine shared
// with others slows both alike, and it reports both rates and hot/spread,
// the issue 24 target (>= 0.8). One b.N is one round of each.
//
//	go test -run '^$' -bench BatchesHotAndSpread -benchtime 20x ./internal/app/ledger/
//
// It starts a PostgreSQL cluster of its own with fsync on, as `ledger bench`
// does (the tests' cluster runs without it, and a commit's flush is what a
// hot account's one committer waits for).
func BenchmarkBatchesHotAndSpread(b *testing.B) {
	const batchClients, batchSize, batchAccounts = 64, 100, 1000
	ctx := context.Background()
	svc := ledger.New(durableStore(b), ledger.Options{})
	b.Cleanup(svc.Close)
	for i := range batchAccounts {
		openAccount(b, svc, fmt.Sprintf("bs-%d", i))
	}
	openAccount(b, svc, "bs-hot")
	var spread, hot time.Duration
	n := 0
	round := func(hotRound bool) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for c := range batchClients {
			body, dup := batchOfDeposits(n, c, batchSize, batchAccounts, hotRound)
			wg.Go(func() {
				r := svc.HandleBatch(ctx, body, 0)
				for i, e := range r.Replies {
					if e.Status != domain.StatusApplied || e.Duplicate != dup[i] {
						b.Errorf("round %d client %d element %d: %+v", n, c, i, e)
						return
					}
				}
			})
		}
		wg.Wait()
		n++
		return time.Since(start)
	}
	for b.Loop() {
		spread += round(false)
		hot += round(true)
	}
	cmds := float64(b.N * batchClients * batchSize)
	b.ReportMetric(cmds/spread.Seconds(), "spread-cmd/s")
	b.ReportMetric(cmds/hot.Seconds(), "hot-cmd/s")
	b.ReportMetric(spread.Seconds()/hot.Seconds(), "hot/spread")
}

// durableStore is the event store on a private cluster with fsync on.
func durableStore(b *testing.B) *postgres.Store {
	b.Helper()
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: b.TempDir(), Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			b.Error(err)
		}
	})
	if err := migrations.Up(ctx, c.URL()); err != nil {
		b.Fatal(err)
	}
	return devtest.Store(b, c.URL())
}

func openAccount(b *testing.B, svc *ledger.Service, id string) {
	b.Helper()
	open := domain.Command{Type: domain.CmdOpenAccount, IdempotencyKey: "open-" + id, AccountID: id, Currency: "EUR"}
	if r := svc.Handle(context.Background(), open); r.Status != domain.StatusApplied {
		b.Fatalf("open %s: %+v", id, r)
	}
}

// batchOfDeposits is the body of client c's batch of round n: size new
// deposits, on the hot account or spread over accounts, and every tenth a
// resend of the same client's new command of the round before of the same
// kind (n-2), as `ledger bench`'s duplicate ratio 0.1 resends answered commands:
// on the hot account, whose aggregate keeps the last 1,024 keys, such a key
// is long forgotten and answered from the store. dup reports which.
func batchOfDeposits(n, c, size, accounts int, hot bool) (body []byte, dup []bool) {
	var sb strings.Builder
	sb.WriteString(`{"commands":[`)
	dup = make([]bool, size)
	for i := range size {
		if i > 0 {
			sb.WriteByte(',')
		}
		m, j := n, i
		if dup[i] = n >= 2 && i%10 == 9; dup[i] {
			m, j = n-2, i-1 // a new command of that round
		}
		acc := "bs-hot"
		if !hot {
			acc = fmt.Sprintf("bs-%d", (m*7919+c*size+j)%accounts)
		}
		fmt.Fprintf(&sb, `{"type":"deposit","idempotency_key":"bs-%d-%d-%d","account_id":%q,"amount":1,"currency":"EUR"}`, m, c, j, acc)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String()), dup
}
