package ledger

import (
	"reflect"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestTransferNotCachedIsDecidedOnTheStore: an instance that has not cached a
// transfer decides a transfer command on a new one without reading its stream
// where the store reports idempotent appends (unreadNewTransfers), and must
// answer as if it had read it: a resend gets its recorded outcome, also when
// this instance's clock is behind and the resend's effective_at would now be
// refused, and so does a transfer to itself (refused, recorded with its
// request alone); another key on the same transfer ID gets transfer_exists;
// nothing is written.
func TestTransferNotCachedIsDecidedOnTheStore(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		clk.Advance(time.Minute)
		body := append(transferBody("t-1", "t1", "alice", "bob", 30), "effective_at", clk.Now().Add(4*time.Second).Format(time.RFC3339Nano))
		first := must(t, s, "transfer", body...)
		self := transferBody("t-self", "self", "alice", "alice", 5) // refused, recorded with its request alone
		refused := send(s, "transfer", self...)
		before := len(devtest.SettledAll(t, st))
		for _, c := range []struct {
			name string
			clk  *devtest.Clock
		}{{"same clock", clk}, {"clock a minute behind", devtest.NewClock()}} {
			fresh := newSagaService(st, c.clk)
			if dup := send(fresh, "transfer", body...); !dup.Duplicate || !sameReply(dup, first) {
				t.Fatalf("%s: resend:\n got %+v\nwant %+v", c.name, dup, first)
			}
			if dup := send(newSagaService(st, c.clk), "transfer", self...); !dup.Duplicate || !sameReply(dup, refused) {
				t.Fatalf("%s: resend of the transfer to itself:\n got %+v\nwant %+v", c.name, dup, refused)
			}
			fresh = newSagaService(st, c.clk)
			r := send(fresh, "transfer", transferBody("t-2", "t1", "alice", "bob", 30)...)
			if r.Code != domain.CodeTransferExists || len(r.Events) != 0 {
				t.Fatalf("%s: the ID under another key: %+v", c.name, r)
			}
		}
		if got := devtest.SettledAll(t, st); len(got) != before {
			t.Fatalf("%d events written by resends and refusals", len(got)-before)
		}
		if a := audit(t, st, true); !reflect.DeepEqual([]int64{a.balance("alice"), a.balance("bob")}, []int64{70, 30}) {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}
