package audit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// countingKurrent is a kurrentdb.Store counting the events ReadStream
// returns.
type countingKurrent struct {
	*kurrentdb.Store
	read atomic.Int64
}

func (c *countingKurrent) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	evs, err := c.Store.ReadStream(ctx, stream, from, dir, max)
	c.read.Add(int64(len(evs)))
	return evs, err
}

// TestAuditOverRefundReadsLinearlyOnKurrentDB: one account on KurrentDB, n
// deposits each refunded once (2n+1 events). A full audit reads at most
// 4(2n+1) events by ReadStream: the over-refund check reads nothing for an
// original whose deposit the fold folded (it read the stream from its first
// event up to each refund before: some n² events).
func TestAuditOverRefundReadsLinearlyOnKurrentDB(t *testing.T) {
	const n = 400
	st, apply := kurrentLedger(t)
	for i := range n {
		apply("deposit", fmt.Sprintf(`{"idempotency_key":"h-d%d","account_id":"h","amount":1000,"currency":"EUR"}`, i))
		apply("refund", fmt.Sprintf(`{"idempotency_key":"h-f%d","original_key":"h-d%d","amount":1}`, i, i))
	}
	c := &countingKurrent{Store: st}
	rep, err := audit.Run(context.Background(), c, audit.Options{})
	if err != nil || !rep.OK() {
		t.Fatalf("%v %v", err, rep)
	}
	t.Logf("events read by ReadStream: %d, of a stream of %d", c.read.Load(), 2*n+1)
	if read, most := c.read.Load(), int64(4*(2*n+1)); read > most {
		t.Fatalf("the audit read %d events of a stream of %d, more than %d", read, 2*n+1, most)
	}
}

// TestAuditOverRefundOfOldOriginalsReadsFromTheirClaimOnKurrentDB: one
// account on KurrentDB, a long history (prefix deposits), then rounds of a
// deposit and a refund of the deposit lag rounds back: more originals back
// than the check keeps, so each refund's original is read. A full audit reads,
// per refund, its original's claim and the stream from the revision the claim
// names up to the refund (at most 2·lag+3 events), whatever the stream's
// length: it read the stream from its first event up to each refund before.
func TestAuditOverRefundOfOldOriginalsReadsFromTheirClaimOnKurrentDB(t *testing.T) {
	const prefix, rounds, lag = 300, 60, 10
	st, apply := kurrentLedger(t)
	for i := range prefix {
		apply("deposit", fmt.Sprintf(`{"idempotency_key":"p-d%d","account_id":"h","amount":10,"currency":"EUR"}`, i))
	}
	refunds := 0
	for i := range rounds {
		apply("deposit", fmt.Sprintf(`{"idempotency_key":"h-d%d","account_id":"h","amount":1000,"currency":"EUR"}`, i))
		if i >= lag {
			apply("refund", fmt.Sprintf(`{"idempotency_key":"h-f%d","original_key":"h-d%d","amount":1}`, i, i-lag))
			refunds++
		}
	}
	c := &countingKurrent{Store: st}
	rep, err := audit.Run(context.Background(), c, audit.Options{})
	if err != nil || !rep.OK() {
		t.Fatalf("%v %v", err, rep)
	}
	stream := 1 + prefix + rounds + refunds
	t.Logf("events read by ReadStream: %d, for %d refunds of a stream of %d", c.read.Load(), refunds, stream)
	if read, most := c.read.Load(), int64(refunds*(2*lag+3)); read > most {
		t.Fatalf("the audit read %d events for %d refunds of a stream of %d, more than %d", read, refunds, stream, most)
	}
}

// TestAuditTransactionRefundsReadLinearlyOnKurrentDB: a transaction of one
// posting on KurrentDB refunded n times, one slot each: a full audit reads
// the original's outcome once (one event) and no slot (the check keeps what
// the slots before refunded); reading every slot before each would be
// n(n+1)/2 events.
func TestAuditTransactionRefundsReadLinearlyOnKurrentDB(t *testing.T) {
	const n = 20
	st, apply := kurrentLedger(t)
	apply("open_account", `{"idempotency_key":"g-open","account_id":"g","currency":"EUR"}`)
	apply("deposit", `{"idempotency_key":"h-d","account_id":"h","amount":1000,"currency":"EUR"}`)
	apply("post_transaction", `{"idempotency_key":"h-post","transaction_id":"h-t","postings":[{"from":"h","to":"g","amount":1000,"currency":"EUR"}]}`)
	for i := range n {
		apply("refund", fmt.Sprintf(`{"idempotency_key":"h-f%d","original_key":"h-post","amount":1}`, i))
	}
	c := &countingKurrent{Store: st}
	rep, err := audit.Run(context.Background(), c, audit.Options{})
	if err != nil || !rep.OK() {
		t.Fatalf("%v %v", err, rep)
	}
	t.Logf("events read by ReadStream: %d, for %d refunds of one transaction", c.read.Load(), n)
	if read := c.read.Load(); read > 1 {
		t.Fatalf("the audit read %d events for %d refunds of one transaction, more than the original's outcome", read, n)
	}
}

// TestAuditOnKurrentDBNamesAnOverRefundOfAForgottenOriginal: deposit h-d0
// (1000) refunded 600 by the ledger, then 64 more deposits (more than the
// originals the check keeps: h-d0 is forgotten), then a forged refund of h-d0
// of 600: a full audit reads h-d0 and its refunds again and names it.
func TestAuditOnKurrentDBNamesAnOverRefundOfAForgottenOriginal(t *testing.T) {
	st, apply := kurrentLedger(t)
	apply("deposit", `{"idempotency_key":"h-d0","account_id":"h","amount":1000,"currency":"EUR"}`)
	apply("refund", `{"idempotency_key":"h-f0","original_key":"h-d0","amount":600}`)
	for i := 1; i <= 64; i++ {
		apply("deposit", fmt.Sprintf(`{"idempotency_key":"h-d%d","account_id":"h","amount":10,"currency":"EUR"}`, i))
	}
	devtest.AppendForgedRefund(t, st, "h", "h-f1", "h-d0", 600)
	rep, err := audit.Run(context.Background(), st, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Has(audit.InvBalance, "refund_exceeds_original") {
		t.Fatalf("not named: %v", rep.Violations)
	}
}

// kurrentLedger is a ledger on a KurrentDB test server with account h open,
// and apply, which has it handle a command that must succeed.
func kurrentLedger(t *testing.T) (*kurrentdb.Store, func(typ, body string)) {
	t.Helper()
	st := devtest.KurrentDB(t)
	l := ledger.New(st, ledger.Options{})
	t.Cleanup(l.Close)
	apply := func(typ, body string) {
		t.Helper()
		if r := l.HandleRaw(context.Background(), typ, []byte(body)); r.Code != "ok" {
			t.Fatalf("%s %s: %+v", typ, body, r)
		}
	}
	apply("open_account", `{"idempotency_key":"h-open","account_id":"h","currency":"EUR"}`)
	return st, apply
}
