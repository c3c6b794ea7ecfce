package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
)

func refundBody(key, orig string, amount int64) []any {
	b := []any{"idempotency_key", key, "original_key", orig}
	if amount > 0 {
		b = append(b, "amount", amount)
	}
	return b
}

// Refunds of deposits and withdrawals: overrun, the same key twice, a rejected original.
func TestRefundsOfAccountCommands(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 0)
		must(t, s, "deposit", "idempotency_key", "d1", "account_id", "alice", "amount", 100, "currency", "EUR")
		first := must(t, s, "refund", refundBody("r1", "d1", 60)...)
		if first.Account.Balance != 40 {
			t.Fatalf("refund: %+v", first)
		}
		// The same key twice: one refund.
		if again := send(newSagaService(st, clk), "refund", refundBody("r1", "d1", 60)...); !again.Duplicate || !sameReply(again, first) {
			t.Fatalf("double refund: %+v", again)
		}
		// Overrun, then the rest by default.
		r := send(s, "refund", refundBody("r2", "d1", 41)...)
		if r.Status != domain.StatusRejected || r.Code != domain.CodeRefundExceedsOriginal {
			t.Fatalf("overrun: %+v", r)
		}
		if r = must(t, s, "refund", refundBody("r3", "d1", 0)...); r.Account.Balance != 0 {
			t.Fatalf("rest: %+v", r)
		}
		// A rejected original.
		r = send(s, "withdraw", "idempotency_key", "w-poor", "account_id", "alice", "amount", 5, "currency", "EUR")
		if r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("withdraw: %+v", r)
		}
		if r = send(s, "refund", refundBody("r4", "w-poor", 0)...); r.Code != domain.CodeNotRefundable {
			t.Fatalf("refund of a rejected withdrawal: %+v", r)
		}
		if r = send(s, "refund", refundBody("r5", "nothing", 0)...); r.Code != domain.CodeOriginalNotFound || len(r.Events) != 0 {
			t.Fatalf("unknown original: %+v", r)
		}
		if n := countType(devtest.StreamEvents(t, st, "account-alice"), domain.EvDebited); n != 2 {
			t.Fatalf("%d refund debits", n)
		}
		audit(t, st, true)
	})
}

// Refunds of transfers: full, partial, overrun, the same key twice, a refund of a
// refund, a rejected original, a refused debit and a refused credit compensated.
func TestRefundsOfTransfers(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 1000)
		openFunded(t, s, "bob", "EUR", 0)

		// Full, by default amount.
		must(t, s, "transfer", transferBody("t-full", "full", "alice", "bob", 100)...)
		r := must(t, s, "refund", refundBody("rf-full", "t-full", 0)...)
		want := []string{"transfer-full:TransferRefundRequested", "bob:Debited", "alice:Credited", "transfer-full:RefundCompleted"}
		if !reflect.DeepEqual(eventTypes(r), want) || r.Transfer.Status != "completed" || r.Account.AccountID != "bob" || r.Account.Balance != 0 {
			t.Fatalf("full refund: %v %+v", eventTypes(r), r)
		}
		if again := send(newSagaService(st, clk), "refund", refundBody("rf-full", "t-full", 0)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("double refund:\n%+v\n%+v", again, r)
		}
		if got, err := s.Lookup(context.Background(), "rf-full"); err != nil || got == nil || !reflect.DeepEqual(*got, r) {
			t.Fatalf("lookup: %v %+v", err, got)
		}
		if r = send(s, "refund", refundBody("rf-more", "t-full", 0)...); r.Code != domain.CodeRefundExceedsOriginal || r.Transfer.Status != "completed" {
			t.Fatalf("nothing left: %+v", r)
		}

		// Partial, then overrun, then the rest.
		must(t, s, "transfer", transferBody("t-part", "part", "alice", "bob", 100)...)
		must(t, s, "refund", refundBody("rp-1", "t-part", 30)...)
		if r = send(s, "refund", refundBody("rp-2", "t-part", 71)...); r.Code != domain.CodeRefundExceedsOriginal ||
			!reflect.DeepEqual(eventTypes(r), []string{"transfer-part:RefundRejected"}) {
			t.Fatalf("overrun: %+v", r)
		}
		if again := send(s, "refund", refundBody("rp-2", "t-part", 71)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("overrun again: %+v", again)
		}
		must(t, s, "refund", refundBody("rp-3", "t-part", 70)...)
		// A refund is not refundable; nor is a refused transfer.
		if r = send(s, "refund", refundBody("rp-4", "rp-1", 0)...); r.Code != domain.CodeNotRefundable {
			t.Fatalf("refund of a refund: %+v", r)
		}
		if r = send(s, "transfer", transferBody("t-poor", "poor", "bob", "alice", 1_000_000)...); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("poor transfer: %+v", r)
		}
		if r = send(s, "refund", refundBody("rp-5", "t-poor", 0)...); r.Code != domain.CodeNotRefundable || r.Transfer.Status != "rejected" {
			t.Fatalf("refund of a rejected transfer: %+v", r)
		}
		// The refund key reused with another request.
		if r = send(s, "refund", refundBody("rp-3", "t-part", 1)...); r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("refund key conflict: %+v", r)
		}

		// The destination spent the money: the refund's debit is refused and its
		// reservation released, so a later refund may take it.
		must(t, s, "transfer", transferBody("t-spent", "spent", "alice", "bob", 50)...)
		must(t, s, "withdraw", "idempotency_key", "bob-spends", "account_id", "bob", "amount", 50, "currency", "EUR")
		r = send(s, "refund", refundBody("rs-1", "t-spent", 50)...)
		if r.Code != domain.CodeInsufficientFunds || r.Transfer.Status != "completed" ||
			!reflect.DeepEqual(eventTypes(r), []string{"transfer-spent:TransferRefundRequested", "bob:CommandRejected", "transfer-spent:RefundRejected"}) {
			t.Fatalf("refused debit: %v %+v", eventTypes(r), r)
		}
		must(t, s, "deposit", "idempotency_key", "bob-earns", "account_id", "bob", "amount", 50, "currency", "EUR")
		must(t, s, "refund", refundBody("rs-2", "t-spent", 50)...)

		// The source closed meanwhile: the refund's credit is refused and its
		// reservation released (TestRefundIntoClosedSource): as a saga, the
		// destination debited, compensated and the refund failed; decided at once,
		// the debit refused with the source's code.
		openFunded(t, s, "carol", "EUR", 40)
		must(t, s, "transfer", transferBody("t-closed", "closed", "carol", "bob", 40)...)
		must(t, s, "close_account", "idempotency_key", "close-carol", "account_id", "carol")
		r = send(s, "refund", refundBody("rc-1", "t-closed", 0)...)
		want = []string{"transfer-closed:TransferRefundRequested", "bob:Debited", "carol:CommandRejected", "transfer-closed:RefundCreditRefused", "bob:Credited", "transfer-closed:RefundFailed"}
		if devtest.MultiAppends(st) {
			want = []string{"transfer-closed:TransferRefundRequested", "bob:CommandRejected", "transfer-closed:RefundRejected"}
		}
		if r.Status != domain.StatusRejected || r.Code != domain.CodeAccountClosed || r.Transfer.Status != "completed" || !reflect.DeepEqual(eventTypes(r), want) {
			t.Fatalf("refused credit: %v %+v", eventTypes(r), r)
		}
		if again := send(newSagaService(st, clk), "refund", refundBody("rc-1", "t-closed", 0)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("failed refund again: %+v", again)
		}
		if r = send(s, "refund", refundBody("rc-2", "t-closed", 40)...); r.Code != domain.CodeAccountClosed {
			t.Fatalf("second try after release: %+v", r)
		}

		a := audit(t, st, true)
		// alice: 1000 - 100 + 100 - 100 + 30 + 70 - 50 + 50; bob: 0 + 100 - 100 + 100 - 100 + 50 - 50 + 50 - 50 + 40
		if a.balance("alice") != 1000 || a.balance("bob") != 40 || a.balance("carol") != 0 {
			t.Fatalf("balances alice %d bob %d carol %d", a.balance("alice"), a.balance("bob"), a.balance("carol"))
		}
		tr := a.transfers["part"]
		if tr.Reserved != 100 || len(tr.RefundOrder) != 4 { // rp-1, rp-2 (overrun), rp-3, rp-4 (of a refund)
			t.Fatalf("part: reserved %d refunds %v", tr.Reserved, tr.RefundOrder)
		}
	})
}

// A refund of a transfer whose source closed after it: the source refuses the
// refund's credit. Where the store appends to several streams at once, the
// refund is one decision over both accounts: rejected with the source's code,
// nothing debited from the destination, nothing credited back. Elsewhere the
// saga debits the destination, credits it back and fails. Either way the
// destination is whole and the reservation released.
func TestRefundIntoClosedSource(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		transferred(t, s)
		must(t, s, "close_account", "idempotency_key", "close-alice", "account_id", "alice")
		before := len(devtest.StreamEvents(t, st, "account-bob"))
		r := send(s, "refund", refundBody("r-1", "t-1", 0)...)
		stage, bobWrote := domain.SagaFailed, []string{domain.EvDebited, domain.EvCredited} // debited, credited back
		if devtest.MultiAppends(st) {
			stage, bobWrote = domain.SagaRejected, []string{domain.EvCommandRejected} // the debit refused
		}
		if r.Status != domain.StatusRejected || r.Code != domain.CodeAccountClosed || r.Account.AccountID != "bob" || r.Account.Balance != 100 {
			t.Fatalf("refund: %+v %+v", r, r.Account)
		}
		var wrote []string
		for _, e := range devtest.StreamEvents(t, st, "account-bob")[before:] {
			wrote = append(wrote, e.Type)
		}
		if !reflect.DeepEqual(wrote, bobWrote) {
			t.Fatalf("the destination's stream got %v, want %v", wrote, bobWrote)
		}
		if again := send(newSagaService(st, clk), "refund", refundBody("r-1", "t-1", 0)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("again: %+v", again)
		}
		a := audit(t, st, true)
		if tr := a.transfers["t1"]; tr.Refunds["r-1"].Stage != stage || tr.Refundable() != 100 || a.balance("bob") != 100 || a.balance("alice") != 0 {
			t.Fatalf("refund %s, refundable %d, bob %d alice %d", tr.Refunds["r-1"].Stage, tr.Refundable(), a.balance("bob"), a.balance("alice"))
		}
	})
}

// A partial and then a full refund of one transfer where the store appends to
// several streams at once: each is one append (the claim, the request, both
// steps and the marker), so no saga step runs (the failpoints after each would
// crash it); a refund beyond what is left is refused; a duplicate answers the
// original reply byte for byte.
func TestRefundsOfTransferAtOnce(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		cs := &countingStore{Store: st, multi: st.(eventstore.MultiAppender)}
		s := newSagaService(cs, clk)
		transferred(t, s)
		s.failpoint = func(step string) error { return fmt.Errorf("%w at %s", errCrash, step) }
		want := []string{"transfer-t1:TransferRefundRequested", "bob:Debited", "alice:Credited", "transfer-t1:RefundCompleted"}
		for _, c := range []struct {
			key        string
			amount     int64
			bob, alice int64
		}{{"r-part", 30, 70, 30}, {"r-rest", 0, 0, 100}} {
			txs := cs.txs.Load()
			r := must(t, s, "refund", refundBody(c.key, "t-1", c.amount)...)
			if n := cs.txs.Load() - txs; n != 1 || !reflect.DeepEqual(eventTypes(r), want) || r.Account.Balance != c.bob {
				t.Fatalf("%s: %d appends, events %v, %+v", c.key, n, eventTypes(r), r.Account)
			}
			dup := send(newSagaService(st, clk), "refund", refundBody(c.key, "t-1", c.amount)...)
			if !dup.Duplicate {
				t.Fatalf("%s again: %+v", c.key, dup)
			}
			dup.Duplicate = false
			if got, want := jsonOf(t, dup), jsonOf(t, r); !bytes.Equal(got, want) {
				t.Fatalf("%s again:\n got %s\nwant %s", c.key, got, want)
			}
			if a := audit(t, st, true); a.balance("bob") != c.bob || a.balance("alice") != c.alice {
				t.Fatalf("%s: bob %d alice %d", c.key, a.balance("bob"), a.balance("alice"))
			}
		}
		s.failpoint = nil // a refusal with the request is one append anyway, through the saga's path
		r := send(s, "refund", refundBody("r-over", "t-1", 1)...)
		if r.Code != domain.CodeRefundExceedsOriginal || !reflect.DeepEqual(eventTypes(r), []string{"transfer-t1:RefundRejected"}) {
			t.Fatalf("beyond the original: %v %+v", eventTypes(r), r)
		}
		if a := audit(t, st, true); a.transfers["t1"].Reserved != 100 {
			t.Fatalf("refunded %d", a.transfers["t1"].Reserved)
		}
	})
}

// One refund sent 20 times at once to two instances: one refund, one debit
// of the destination and one credit of the source, every reply the same.
func TestSameRefundTwentyTimesTwoInstances(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		svcs := twoSagaServices(st, clk)
		transferred(t, svcs[0])
		replies := make([]Reply, 20)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = send(svcs[i%2], "refund", refundBody("r-1", "t-1", 40)...)
			}()
		}
		wg.Wait()
		if o := oneOriginal(t, replies); o.Status != domain.StatusApplied {
			t.Fatalf("the refund: %+v, want applied", o)
		}
		if n := countType(devtest.StreamEvents(t, st, "account-bob"), domain.EvDebited); n != 1 {
			t.Fatalf("%d debits of bob", n)
		}
		if n := countType(devtest.StreamEvents(t, st, "account-alice"), domain.EvCredited); n != 2 { // funded, refunded
			t.Fatalf("%d credits of alice", n)
		}
		if a := audit(t, st, true); a.balance("alice") != 40 || a.balance("bob") != 60 {
			t.Fatalf("alice %d bob %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

// transferred opens alice with 100 and bob with nothing, and transfers the 100
// from alice to bob through s (transfer t1, key t-1).
func transferred(t *testing.T, s *Service) {
	t.Helper()
	openFunded(t, s, "alice", "EUR", 100)
	openFunded(t, s, "bob", "EUR", 0)
	must(t, s, "transfer", transferBody("t-1", "t1", "alice", "bob", 100)...)
}

// jsonOf is a reply as the wire carries it.
func jsonOf(t *testing.T, r Reply) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A crash at every step of a refund's saga, then the process finishes it; and a
// refund that arrives while its transfer is still in flight waits for it.
func TestRefundCrashAtEveryStep(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		setup := newSagaService(st, clk)
		openFunded(t, setup, "alice", "EUR", 10_000)
		openFunded(t, setup, "bob", "EUR", 0)
		rig := &crashRig{t: t, st: st, clk: clk, newService: newSagaService}
		type path struct {
			crashPath
			code domain.Code
		}
		paths := []path{
			{crashPath{"completed", []string{"refund/requested", "refund/debit", "refund/credit", "refund/complete"}}, domain.CodeOK},
			{crashPath{"rejected", []string{"refund/debit", "refund/reject"}}, domain.CodeInsufficientFunds},
			{crashPath{"failed", []string{"refund/credit", "refund/refuse", "refund/compensate", "refund/fail"}}, domain.CodeAccountClosed},
		}
		everyStep(rig, paths, []string{byProcess}, func(p path, step, by, id string) {
			src, dst := "src-"+id, "dst-"+id
			openFunded(t, setup, src, "EUR", 10)
			openFunded(t, setup, dst, "EUR", 0)
			must(t, setup, "transfer", transferBody("t-"+id, id, src, dst, 10)...)
			switch p.name {
			case "rejected": // the destination spent the money
				must(t, setup, "withdraw", "idempotency_key", "spend-"+id, "account_id", dst, "amount", 10, "currency", "EUR")
			case "failed": // the source closed
				must(t, setup, "close_account", "idempotency_key", "close-"+id, "account_id", src)
			}
			r := rig.crashThenRecover("refund", refundBody("r-"+id, "t-"+id, 0), step, by, func() { audit(t, st, false) })
			if r.Code != p.code {
				t.Fatalf("%s after recovery: %+v", id, r)
			}
			a := audit(t, st, true)
			want := map[string][2]int64{"completed": {10, 0}, "rejected": {0, 0}, "failed": {0, 10}}[p.name]
			if a.balance(src) != want[0] || a.balance(dst) != want[1] {
				t.Fatalf("%s: src %d dst %d", id, a.balance(src), a.balance(dst))
			}
		})

		// A refund of a transfer still in flight drives the transfer first.
		crashing := newSagaService(st, clk)
		crashAt(crashing, "transfer/debit")
		if r := send(crashing, "transfer", transferBody("t-inflight", "inflight", "alice", "bob", 10)...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		r := must(t, newSagaService(st, clk), "refund", refundBody("r-inflight", "t-inflight", 0)...)
		if r.Transfer.Status != "completed" {
			t.Fatalf("refund of an in-flight transfer: %+v", r)
		}
		audit(t, st, true)
	})
}
