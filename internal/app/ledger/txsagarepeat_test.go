package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// beforeAppend runs its hook before each single-stream append it passes on.
type beforeAppend struct {
	eventstore.Store
	hook func(stream string)
}

func (b beforeAppend) Append(ctx context.Context, stream string, exp eventstore.ExpectedRevision, evs []eventstore.EventData) (eventstore.AppendResult, error) {
	b.hook(stream)
	return b.Store.Append(ctx, stream, exp, evs)
}

// TestTransactionSagaRequestDecidedMeanwhile: on a store without multi-stream
// appends, b finds no transaction stream and decides the request; before its
// append, a (another instance, another clock) decides the same key and drives
// the whole saga. b's request carries the IDs a's already holds at revision 0:
// the store takes it for a repeat (reported, or found by the read-back on
// KurrentDB), and b must answer a's outcome as a duplicate, not its own
// decision as an original.
func TestTransactionSagaRequestDecidedMeanwhile(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		late, early := devtest.NewClock(), devtest.NewClock()
		late.Advance(time.Minute)
		a := New(st, Options{Clock: late.Now})
		defer a.Close()
		mustApply(t, a, "open_account", `{"idempotency_key":"open-x","account_id":"x","currency":"EUR"}`)
		mustApply(t, a, "open_account", `{"idempotency_key":"open-y","account_id":"y","currency":"EUR"}`)
		mustApply(t, a, "deposit", `{"idempotency_key":"dep","account_id":"x","amount":100,"currency":"EUR"}`)
		body := txBody("tk", "t1", posting("x", "y", 30, "EUR"))
		txs := domain.TransactionStream("t1")
		var first Reply
		b := New(beforeAppend{st, func(stream string) {
			if stream == txs && first.Status == "" {
				first = post(t, a, "post_transaction", body)
			}
		}}, Options{Clock: early.Now})
		defer b.Close()
		second := post(t, b, "post_transaction", body)
		if first.Status == "" {
			t.Fatal("b never appended to the transaction's stream")
		}
		if got := oneOriginal(t, []Reply{first, second}); got.Duplicate || first.Duplicate {
			t.Fatalf("a decided the key first and must be the original: a %+v\nb %+v", first, second)
		}
		audit(t, st, true)
	})
}
