package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// subjectCounter counts a PostgreSQL store's reads by subject.
type subjectCounter struct {
	*postgres.Store
	reads atomic.Int64
}

func (c *subjectCounter) ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]eventstore.RecordedEvent, error) {
	c.reads.Add(1)
	return c.Store.ReadStreamSubject(ctx, stream, subject, max)
}

// BenchmarkForgottenRecall measures, on PostgreSQL, what the bound on closed
// holds and refunded originals costs the commands it touches: on an account
// that forgot some ("forgot": a bound of 1), a command naming a hold or an
// original its aggregate does not keep reads that subject's events first (one
// indexed read under the account's lock), even when there are none; on one
// that forgot none ("kept": no bound) it does not. Each op is a pair of
// commands, one of which pays the read when forgot: placing a new hold and
// releasing it; depositing and refunding a part of that deposit (a first
// refund). forgot minus kept is the read. Run with
//
//	go test ./internal/app/ledger -run '^$' -bench ForgottenRecall -benchtime 2000x -count 3
func BenchmarkForgottenRecall(b *testing.B) {
	st := &subjectCounter{Store: devtest.Store(b, devtest.DatabaseURL(b))}
	for _, c := range []struct {
		name  string
		limit int
	}{{"kept", -1}, {"forgot", 1}} {
		for _, pair := range []string{"hold", "refund"} {
			b.Run(pair+"/"+c.name, func(b *testing.B) {
				svc := ledger.New(st, ledger.Options{RecentHolds: c.limit, RecentRefunds: c.limit, Clock: devtest.NewClock().Now})
				defer svc.Close()
				p := fmt.Sprintf("%s-%s-%d-", pair, c.name, time.Now().UnixNano())
				acct := p + "acct"
				send := func(typ string, kv ...any) {
					b.Helper()
					body := map[string]any{}
					for i := 0; i < len(kv); i += 2 {
						body[kv[i].(string)] = kv[i+1]
					}
					cmd := devtest.NewCommand(typ, body)
					if r := svc.HandleRaw(context.Background(), cmd.Type, cmd.Body); r.Status != domain.StatusApplied {
						b.Fatalf("%s %s: %+v", typ, cmd.Body, r)
					}
				}
				send("open_account", "idempotency_key", p+"open", "account_id", acct, "currency", "EUR")
				send("deposit", "idempotency_key", p+"fund", "account_id", acct, "amount", 1_000_000_000, "currency", "EUR")
				for i := range 3 { // closed holds and refunded originals beyond the bound of 1
					send("place_hold", "idempotency_key", fmt.Sprintf("%sseed-h%d", p, i), "account_id", acct, "hold_id", fmt.Sprintf("%sseed-%d", p, i), "amount", 1, "currency", "EUR")
					send("release_hold", "idempotency_key", fmt.Sprintf("%sseed-r%d", p, i), "account_id", acct, "hold_id", fmt.Sprintf("%sseed-%d", p, i))
					send("deposit", "idempotency_key", fmt.Sprintf("%sseed-d%d", p, i), "account_id", acct, "amount", 10, "currency", "EUR")
					send("refund", "idempotency_key", fmt.Sprintf("%sseed-f%d", p, i), "original_key", fmt.Sprintf("%sseed-d%d", p, i), "amount", 1)
				}
				before := st.reads.Load()
				for i := 0; b.Loop(); i++ {
					if pair == "hold" {
						id := fmt.Sprintf("%sh%d", p, i)
						send("place_hold", "idempotency_key", p+"place-"+id, "account_id", acct, "hold_id", id, "amount", 1, "currency", "EUR")
						send("release_hold", "idempotency_key", p+"release-"+id, "account_id", acct, "hold_id", id)
						continue
					}
					dep := fmt.Sprintf("%sdep-%d", p, i)
					send("deposit", "idempotency_key", dep, "account_id", acct, "amount", 10, "currency", "EUR")
					send("refund", "idempotency_key", dep+"-refund", "original_key", dep, "amount", 1)
				}
				reads := float64(st.reads.Load()-before) / float64(b.N)
				b.ReportMetric(reads, "subject-reads/op")
				if want := 1.0; (c.limit > 0) != (reads >= want) {
					b.Fatalf("%.2f reads by subject per op with a bound of %d", reads, c.limit)
				}
			})
		}
	}
}
