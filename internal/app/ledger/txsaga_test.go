package ledger

import (
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// txSagaSteps are the failpoints of a reservation saga over alice, bob and
// fee, by the path it takes.
var (
	txPostedSteps = []string{"transaction/requested", "transaction/reserve:alice", "transaction/reserve:bob", "transaction/reserve:fee",
		"transaction/reserved", "transaction/leg:alice", "transaction/leg:bob", "transaction/leg:fee", "transaction/posted"}
	txRejectedSteps = []string{"transaction/requested", "transaction/reserve:alice", "transaction/reserve:bob", "transaction/reserve:fee",
		"transaction/refused", "transaction/release:bob", "transaction/release:fee", "transaction/rejected"}
)

// TestTransactionSagaCrashAtEveryStep: on the stores where a transaction is a
// reservation saga (KurrentDB, and memory and PostgreSQL with their
// multi-stream append hidden), a crash at every step of both paths, then a
// recovery by the transfer process (another instance) or by the client's
// retry: every transaction ends with its outcome, all of its postings applied
// exactly once or none of them, every reservation released, and every later
// duplicate answers that outcome. Forgetful: the same where every aggregate
// keeps one key, so that the steps a recovery runs again were forgotten and
// are found through their claims.
func TestTransactionSagaCrashAtEveryStep(t *testing.T) {
	transactionSagaCrashAtEveryStep(t, newSagaService)
}

func TestTransactionSagaCrashAtEveryStepForgetful(t *testing.T) {
	transactionSagaCrashAtEveryStep(t, forgetfulSagaService)
}

func transactionSagaCrashAtEveryStep(t *testing.T, newSagaService func(Store, *devtest.Clock) *Service) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		setup := newSagaService(st, clk)
		openFunded(t, setup, "alice", "EUR", 100_000)
		openFunded(t, setup, "bob", "EUR", 0)
		openFunded(t, setup, "fee", "EUR", 0)
		rig := &crashRig{t: t, st: st, clk: clk, newService: newSagaService}
		type path struct {
			crashPath
			postings []map[string]any
			status   string
			posting  int
		}
		paths := []path{
			// bob pays its fee from what the first posting brings it: it reserves nothing.
			{crashPath{"posted", txPostedSteps}, []map[string]any{txPosting("alice", "bob", 100), txPosting("alice", "fee", 5), txPosting("bob", "fee", 1)}, "posted", -1},
			{crashPath{"rejected", txRejectedSteps}, []map[string]any{txPosting("alice", "bob", 10), txPosting("bob", "fee", 1), txPosting("alice", "fee", 1_000_000)}, "rejected", 2},
		}
		posted := 0
		everyStep(rig, paths, byEither, func(p path, step, by, id string) {
			body := []any{"idempotency_key", "k-" + id, "transaction_id", id, "postings", p.postings}
			r := rig.crashThenRecover("post_transaction", body, step, by, func() {})
			if r.Transaction == nil || r.Transaction.Status != p.status || (p.posting >= 0 && (r.Posting == nil || *r.Posting != p.posting || r.Code != domain.CodeInsufficientFunds)) {
				t.Fatalf("%s crashed at %s, recovered by %s: %+v", id, step, by, r)
			}
			if p.status == "posted" {
				posted++
			}
			checkTxBalances(t, st, posted)
		})
	})
}

func txPosting(from, to string, amount int64) map[string]any {
	return map[string]any{"from": from, "to": to, "amount": amount, "currency": "EUR"}
}

// checkTxBalances checks alice, bob and fee after `posted` posted transactions
// of the crash test (and none of its rejected ones): nothing held.
func checkTxBalances(t *testing.T, st ProcessStore, posted int) {
	t.Helper()
	want := map[string]int64{"alice": 100_000 - int64(posted)*105, "bob": int64(posted) * 99, "fee": int64(posted) * 6}
	for id, bal := range want {
		acc := devtest.Account(t, st, id)
		if acc.Balance != bal || acc.Held != 0 {
			t.Fatalf("%s: balance %d held %d, want %d held 0", id, acc.Balance, acc.Held, bal)
		}
	}
}

// TestTransactionSagaReservesFirst: while a reservation saga is between its
// reservations and its legs, the money it will take is held (a withdrawal of
// it is refused), and an account it only credits cannot be closed; a refused
// reservation leaves every account as it was; a refund of the posted
// transaction is a saga of its own, in full.
func TestTransactionSagaReservesFirst(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "shop", "EUR", 0)
		body := []any{"idempotency_key", "pay", "transaction_id", "pay-1", "postings", []map[string]any{txPosting("alice", "shop", 80)}}
		crashing := newSagaService(st, clk)
		crashAt(crashing, "transaction/reserved")
		if r := send(crashing, "post_transaction", body...); r.Status != domain.StatusError {
			t.Fatalf("no crash: %+v", r)
		}
		if r := send(s, "withdraw", "idempotency_key", "w", "account_id", "alice", "amount", 30, "currency", "EUR"); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("withdrawing reserved money: %+v", r)
		}
		if r := send(s, "close_account", "idempotency_key", "c", "account_id", "shop"); r.Code != domain.CodeAccountNotEmpty {
			t.Fatalf("closing an account a running transaction credits: %+v", r)
		}
		crashing.failpoint = nil
		if r := send(crashing, "post_transaction", body...); r.Transaction == nil || r.Transaction.Status != "posted" {
			t.Fatalf("finished by the retry: %+v", r)
		}
		if a, b := devtest.Account(t, st, "alice"), devtest.Account(t, st, "shop"); a.Balance != 20 || a.Held != 0 || b.Balance != 80 || b.Held != 0 {
			t.Fatalf("alice %d (held %d), shop %d (held %d)", a.Balance, a.Held, b.Balance, b.Held)
		}
		refund := send(s, "refund", "idempotency_key", "back", "original_key", "pay")
		if refund.Status != domain.StatusApplied || refund.Transaction == nil || refund.Transaction.Status != "posted" ||
			!strings.HasPrefix(refund.Transaction.TransactionID, "pay-1~refund~") {
			t.Fatalf("refund: %+v", refund)
		}
		if r := send(s, "refund", "idempotency_key", "back2", "original_key", "pay"); r.Code != domain.CodeRefundExceedsOriginal {
			t.Fatalf("a second full refund: %+v", r)
		}
		if a, b := devtest.Account(t, st, "alice"), devtest.Account(t, st, "shop"); a.Balance != 100 || b.Balance != 0 {
			t.Fatalf("after the refund: alice %d, shop %d", a.Balance, b.Balance)
		}
		over := send(s, "post_transaction", "idempotency_key", "big", "transaction_id", "big-1", "postings", []map[string]any{txPosting("shop", "alice", 1), txPosting("alice", "shop", 500)})
		if over.Code != domain.CodeInsufficientFunds || over.Posting == nil || *over.Posting != 0 || over.Transaction.Status != "rejected" {
			t.Fatalf("shop cannot pay 1, alice cannot pay 500: the first posting decides: %+v", over)
		}
		if a, b := devtest.Account(t, st, "alice"), devtest.Account(t, st, "shop"); a.Balance != 100 || a.Held != 0 || b.Balance != 0 || b.Held != 0 {
			t.Fatalf("a refused transaction moved money: alice %d (held %d), shop %d (held %d)", a.Balance, a.Held, b.Balance, b.Held)
		}
	})
}
