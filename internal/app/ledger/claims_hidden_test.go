package ledger

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// depositUnderK credits account a with 100 under the key K.
const depositUnderK = `{"idempotency_key":"K","account_id":"a","amount":100,"currency":"EUR"}`

// creditedUnderK is a KurrentDB test server, the store on it (with the
// ledger's options, as in production) and a ledger instance with account a
// open, for a test to send depositUnderK and more.
func creditedUnderK(t *testing.T) (*kurrenttest.Server, *kurrentdb.Store, *Service) {
	srv, url := kurrenttest.Start(t)
	st := devtest.OpenKurrentDB(t, url, config.KurrentDBOptions(quietLog)...)
	s := New(st, Options{Clock: clock, Logger: quietLog})
	mustApply(t, s, "open_account", `{"idempotency_key":"open","account_id":"a","currency":"EUR"}`)
	return srv, st, s
}

// TestHiddenClaimNeverMovesMoneyTwice: on KurrentDB a key stream soft-deleted,
// or truncated by a $tb past its claim, hides the claim from reads but not
// from the server's idempotency check. A credit under K, 1,035 more on the
// account (so that it forgets K), key-K hidden: on a fresh instance, K resent
// with the same body used to find no claim, have its claim append answered as
// a repeat at revision 0 (taken for a fresh write), and credit the account a
// second time; with another body (soft delete) the server un-deleted the key
// stream and wrote the claim at revision 1, taken for a new claim: a second
// credit again. Now each resend answers the original or stops with an error,
// and the balance changes once. (On the old backend and claim read the
// same-body resend was applied: balance 100 too many.)
func TestHiddenClaimNeverMovesMoneyTwice(t *testing.T) {
	for _, how := range []string{"soft delete", "$tb past it"} {
		t.Run(how, func(t *testing.T) {
			srv, st, s := creditedUnderK(t)
			opts := s.opts
			body := depositUnderK
			first := mustApply(t, s, "deposit", body)
			const more, measured = 1035, 10
			var reads int
			for i := range more {
				if i == more-measured {
					reads = srv.Requests(kurrenttest.MethodRead)
				}
				mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"k%d","account_id":"a","amount":1,"currency":"EUR"}`, i))
			}
			// Past its 1,024 keys the account reads each new key's claim
			// first, and finds none: one read, not two (no metadata read
			// of an absent key stream: config.KurrentDBOptions); and it
			// reads its append's last event back, as every append on
			// KurrentDB (repeats.go): two reads a deposit.
			if n := srv.Requests(kurrenttest.MethodRead) - reads; n > 2*measured {
				t.Fatalf("%d reads for the last %d deposits, on an account that forgot keys: want two each", n, measured)
			}
			s.Close()
			c := kurrenttest.Client(t, srv.ConnectionString())
			if how == "soft delete" {
				if _, err := c.DeleteStream(context.Background(), domain.KeyStream("K"), esdb.DeleteStreamOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				var m esdb.StreamMetadata
				m.SetTruncateBefore(1)
				if _, err := c.SetStreamMetadata(context.Background(), domain.KeyStream("K"), esdb.AppendToStreamOptions{}, m); err != nil {
					t.Fatal(err)
				}
			}
			fresh := New(st, opts)
			defer fresh.Close()
			for _, resend := range []string{body, `{"idempotency_key":"K","account_id":"a","amount":7,"currency":"EUR"}`, body} {
				r := post(t, fresh, "deposit", resend)
				switch {
				case r.Status == domain.StatusError:
				case resend == body && r.Duplicate && r.Account != nil && r.Account.Balance == first.Account.Balance:
				case resend != body && r.Code == domain.CodeIdempotencyKeyConflict:
				default:
					t.Fatalf("resend %s after the key stream's %s: %+v", resend, how, r)
				}
			}
			if got, want := devtest.Account(t, st, "a").Balance, int64(100+more); got != want {
				t.Fatalf("balance %d, want %d: K moved money again", got, want)
			}
		})
	}
}

// TestDeletedAccountIsNeverTakenForNew: a deleted account stream reads as
// not found, as one never written does, while the server keeps its events (in
// $all, in the read models): soft-deleted, it also checks appends against them
// and un-deletes the stream at N+1 on the next write; tombstoned, it refuses
// every write. On a fresh instance, the resend of a deposit it had applied was
// answered rejected account_not_found (a definite answer, and wrong: the money
// had moved); on the soft-deleted stream an open_account under a new key was
// written at revision 2, over its hidden history. Now every command on it
// stops with an error and writes nothing. (On the old backend: the first
// resend rejected, account_not_found, after either delete.)
func TestDeletedAccountIsNeverTakenForNew(t *testing.T) {
	for _, tombstone := range []bool{false, true} {
		t.Run(fmt.Sprintf("tombstone %v", tombstone), func(t *testing.T) {
			srv, st, s := creditedUnderK(t)
			opts := s.opts
			mustApply(t, s, "deposit", depositUnderK)
			s.Close()
			c := kurrenttest.Client(t, srv.ConnectionString())
			var err error
			if tombstone {
				_, err = c.TombstoneStream(context.Background(), domain.AccountStream("a"), esdb.TombstoneStreamOptions{})
			} else {
				_, err = c.DeleteStream(context.Background(), domain.AccountStream("a"), esdb.DeleteStreamOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			fresh := New(st, opts)
			defer fresh.Close()
			for _, cmd := range [][2]string{
				{"deposit", depositUnderK},
				{"deposit", `{"idempotency_key":"K2","account_id":"a","amount":1,"currency":"EUR"}`},
				{"open_account", `{"idempotency_key":"open2","account_id":"a","currency":"EUR"}`},
			} {
				if r := post(t, fresh, cmd[0], cmd[1]); r.Status != domain.StatusError {
					t.Fatalf("%s %s on the deleted account: %s %s (%s), want an error", cmd[0], cmd[1], r.Status, r.Code, r.Message)
				}
			}
			if n := eventsOf(t, st, domain.AccountStream("a")); n != 2 {
				t.Fatalf("the deleted account stream holds %d events, want its 2", n)
			}
		})
	}
}

// eventsOf counts the events of stream in $all.
func eventsOf(t *testing.T, st *kurrentdb.Store, stream string) int {
	all, err := st.ReadAll(context.Background(), eventstore.Start, 10000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range all {
		if e.Stream == stream {
			n++
		}
	}
	return n
}

// hidingStore is a store (without multi-stream appends or event lookups, as
// KurrentDB through the v4 client) whose reads cannot show one stream, as a
// KurrentDB node's reads hide a soft-deleted one, and which counts the appends
// to it.
type hidingStore struct {
	Store
	hidden  string
	appends atomic.Int32
}

func (h *hidingStore) Append(ctx context.Context, stream string, exp eventstore.ExpectedRevision, evs []eventstore.EventData) (eventstore.AppendResult, error) {
	if stream == h.hidden {
		h.appends.Add(1)
	}
	return h.Store.Append(ctx, stream, exp, evs)
}

func (h *hidingStore) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	if stream == h.hidden {
		return nil, eventstore.ErrStreamNotFound
	}
	return h.Store.ReadStream(ctx, stream, from, dir, max)
}

// TestClaimTheStoreHoldsButCannotShowStopsTheCommand: a claim append refused
// because the key stream exists, whose claim reads cannot show, used to be
// taken for a claim that vanished and decided again, up to MaxAttempts (8
// appends to the key stream); now the command stops at the first, with an
// error, and nothing moves.
func TestClaimTheStoreHoldsButCannotShowStopsTheCommand(t *testing.T) {
	st := &hidingStore{Store: memory.New()}
	s := New(st, Options{Clock: clock, Logger: quietLog})
	defer s.Close()
	mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"K","account_id":"a","amount":100,"currency":"EUR"}`)
	st.hidden = domain.KeyStream("K")
	r := post(t, s, "deposit", `{"idempotency_key":"K","account_id":"b","amount":100,"currency":"EUR"}`)
	if r.Status != domain.StatusError || st.appends.Load() != 1 {
		t.Fatalf("another request under K, its claim hidden: %+v after %d claim appends; want an error after 1", r, st.appends.Load())
	}
	if b := devtest.Account(t, st.Store, "b").Balance; b != 0 {
		t.Fatalf("b's balance %d", b)
	}
}
