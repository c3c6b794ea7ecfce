package ledger

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// readCounting is the memory store counting the reads a cold load makes
// (ReadCold, ReadStream) and the events located by ID (key lookups).
type readCounting struct {
	*memory.Store
	reads, located atomic.Int64
}

func (c *readCounting) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	c.reads.Add(1)
	return c.Store.ReadStream(ctx, stream, from, dir, max)
}

func (c *readCounting) ReadCold(ctx context.Context, streams []string, max int) ([]eventstore.ColdStream, error) {
	c.reads.Add(1)
	return c.Store.ReadCold(ctx, streams, max)
}

func (c *readCounting) ReadEventByID(ctx context.Context, id uuid.UUID) (eventstore.RecordedEvent, error) {
	c.located.Add(1)
	return c.Store.ReadEventByID(ctx, id)
}

// residentService is a service whose cache holds 2 aggregates over a store
// of n accounts, each opened and given deposits under keys d<i>-<j>: the
// accounts it dropped are its residents.
func residentService(t *testing.T, n, deposits int, opts Options) (*Service, *readCounting) {
	t.Helper()
	st := &readCounting{Store: memory.New()}
	opts.Clock, opts.CacheSize = clock, 2
	s := New(st, opts)
	t.Cleanup(s.Close)
	for i := range n {
		mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"o%d","account_id":"r%d","currency":"EUR"}`, i, i))
		for j := range deposits {
			mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d-%d","account_id":"r%d","amount":%d,"currency":"EUR"}`, i, j, i, 10+j))
		}
	}
	return s, st
}

// TestEvictedAccountsDecideFromResidents: accounts the cache dropped are
// decided from their residents without a read of the store, on the state
// the store holds (each reply's balances and revision, and the store's fold,
// agree). It fails when a dropped account is not made resident (a read per
// command), when a resident forgets the balance, when its loads are not
// counted under origin eviction, or when the residents made of accounts
// this process wrote are not counted as such (head decided: each account
// was dropped just after its last deposit was written).
func TestEvictedAccountsDecideFromResidents(t *testing.T) {
	const n = 12
	s, st := residentService(t, n, 2, Options{})
	if got := s.Residents(); got != n-2 {
		t.Fatalf("%d residents, want %d (the accounts the cache of 2 dropped)", got, n-2)
	}
	if got, read := counterValue(t, s.metrics.residentsMade.WithLabelValues("decided")), counterValue(t, s.metrics.residentsMade.WithLabelValues("read")); got != n-2 || read != 0 {
		t.Fatalf("residents made of written heads %v, of read ones %v, want %d and 0", got, read, n-2)
	}
	for i := range n - 2 {
		before := st.reads.Load()
		r := mustApply(t, s, "withdraw", fmt.Sprintf(`{"idempotency_key":"w%d","account_id":"r%d","amount":5,"currency":"EUR"}`, i, i))
		if reads := st.reads.Load() - before; reads != 0 {
			t.Fatalf("r%d: %d reads of the store for a resident account", i, reads)
		}
		want := devtest.Account(t, st, fmt.Sprintf("r%d", i))
		if r.Account.Balance != 16 || want.Balance != 16 || int64(r.Account.Revision) != want.Revision {
			t.Fatalf("r%d: replied balance %d revision %d, the store %d at %d, want 16", i, r.Account.Balance, r.Account.Revision, want.Balance, want.Revision)
		}
	}
	if got := counterValue(t, s.metrics.residentLoads.WithLabelValues("eviction")); got != n-2 {
		t.Fatalf("%v resident loads of evicted accounts, want %d", got, n-2)
	}
	if got := counterValue(t, s.metrics.residentLoads.WithLabelValues("warm")); got != 0 {
		t.Fatalf("%v resident loads counted as warmed, none was", got)
	}
}

// TestResidentDuplicatesAnswerTheOriginal: on accounts decided from their
// residents, a resend of a recent key (its print kept), of an older one (its
// print forgotten: the store refuses its events) and of a key with another
// request are answered as the first time: the original reply, duplicate, or
// idempotency_key_conflict, and nothing is written.
func TestResidentDuplicatesAnswerTheOriginal(t *testing.T) {
	const deposits = 6 // more keys than a resident keeps prints of
	s, st := residentService(t, 3, 0, Options{})
	orig := map[string]Reply{}
	for j := range deposits {
		key := fmt.Sprintf("d0-%d", j)
		orig[key] = mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":%q,"account_id":"r0","amount":%d,"currency":"EUR"}`, key, 10+j))
	}
	for _, key := range []string{"d0-5", "d0-0", "d0-4", "d0-1"} {
		for i := 1; i < 3; i++ { // two other accounts through the cache of 2: r0 is resident again
			mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"x%d-%s","account_id":"r%d","amount":1,"currency":"EUR"}`, i, key, i))
		}
		if !s.residents.has(domain.AccountStream("r0")) {
			t.Fatal("r0 not resident")
		}
		head := devtest.Account(t, st, "r0").Revision
		j := int(key[len(key)-1] - '0')
		r := post(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":%q,"account_id":"r0","amount":%d,"currency":"EUR"}`, key, 10+j))
		want := orig[key]
		if !r.Duplicate || r.Status != domain.StatusApplied || !reflect.DeepEqual(r.Account, want.Account) || !reflect.DeepEqual(r.Events, want.Events) {
			t.Fatalf("resend of %s: %+v, want the original %+v as a duplicate", key, r, want)
		}
		if c := post(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":%q,"account_id":"r0","amount":999,"currency":"EUR"}`, key)); c.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("%s with another amount: %s %s", key, c.Status, c.Code)
		}
		if got := devtest.Account(t, st, "r0").Revision; got != head {
			t.Fatalf("resends of %s wrote: revision %d, was %d", key, got, head)
		}
	}
}

// TestResidentPrintCollisionsNeverAnswerAnother: with a print under which
// every key collides, every new command on a resident account is looked up
// in the store first (by its own key's event ID: found nowhere) and decided
// as new, never answered as another key's duplicate, and a resend is still
// the duplicate it is. It fails when the prints do not route (no lookup).
func TestResidentPrintCollisionsNeverAnswerAnother(t *testing.T) {
	s, st := residentService(t, 6, 1, Options{})
	s.residents.print = func(string) uint64 { return 42 }
	for i := range 6 { // made resident again under the colliding print
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"c%d","account_id":"r%d","amount":1,"currency":"EUR"}`, i, i))
	}
	for i := range 6 {
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"e%d","account_id":"r%d","amount":1,"currency":"EUR"}`, i, i))
	}
	for i := range 4 {
		before := st.located.Load()
		r := mustApply(t, s, "withdraw", fmt.Sprintf(`{"idempotency_key":"n%d","account_id":"r%d","amount":2,"currency":"EUR"}`, i, i))
		if r.Duplicate || r.Account.Balance != 10 {
			t.Fatalf("r%d: a new withdrawal under a colliding print: %+v", i, r)
		}
		if st.located.Load() == before {
			t.Fatalf("r%d: a colliding print was not looked up", i)
		}
	}
	for i := 4; i < 6; i++ { // r0 resident again
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"f%d","account_id":"r%d","amount":1,"currency":"EUR"}`, i, i))
	}
	if r := post(t, s, "withdraw", `{"idempotency_key":"n0","account_id":"r0","amount":2,"currency":"EUR"}`); !r.Duplicate || r.Account.Balance != 10 {
		t.Fatalf("resend of n0: %+v", r)
	}
	if got := devtest.Account(t, st, "r0").Balance; got != 10 {
		t.Fatalf("r0: balance %d in the store, want 10", got)
	}
}

// TestResidentsBounded: at ResidentAccounts the residents stay bounded
// (the others dropped), and every account, resident or dropped, is decided
// on the store's state; a store that locates no events by ID has none, and
// with none kept none is counted made (ledger_residents_made_total).
func TestResidentsBounded(t *testing.T) {
	const n, bound = 20, 5
	s, st := residentService(t, n, 1, Options{ResidentAccounts: bound})
	if got := s.Residents(); got != bound {
		t.Fatalf("%d residents, want the bound %d", got, bound)
	}
	for i := range n {
		r := mustApply(t, s, "withdraw", fmt.Sprintf(`{"idempotency_key":"w%d","account_id":"r%d","amount":4,"currency":"EUR"}`, i, i))
		if want := devtest.Account(t, st, fmt.Sprintf("r%d", i)); r.Account.Balance != 6 || want.Balance != 6 {
			t.Fatalf("r%d: balance %d, the store %d, want 6", i, r.Account.Balance, want.Balance)
		}
		if got := s.Residents(); got > bound {
			t.Fatalf("%d residents, over the bound %d", got, bound)
		}
	}
	none, _ := residentService(t, 6, 0, Options{ResidentAccounts: -1})
	if got := none.Residents(); got != 0 {
		t.Fatalf("%d residents with none asked for", got)
	}
	if made := counterValue(t, none.metrics.residentsMade.WithLabelValues("decided")) + counterValue(t, none.metrics.residentsMade.WithLabelValues("read")); made != 0 {
		t.Fatalf("%v residents counted made with none asked for", made)
	}
	unguarded := New(devtest.WithoutMultiAppend(memory.New()), Options{Clock: clock, CacheSize: 2})
	defer unguarded.Close()
	for i := range 6 {
		mustApply(t, unguarded, "open_account", fmt.Sprintf(`{"idempotency_key":"o%d","account_id":"r%d","currency":"EUR"}`, i, i))
	}
	if got := unguarded.Residents(); got != 0 {
		t.Fatalf("%d residents on a store that locates no events", got)
	}
}

// TestNoResidentOfABusyAccount: an aggregate the cache drops while a
// command holds its stream's lock, or while it has appends in flight or
// stale, is not made resident (it may be mid-command, or ahead of the store).
func TestNoResidentOfABusyAccount(t *testing.T) {
	s := New(memory.New(), Options{Clock: clock})
	defer s.Close()
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"b","currency":"EUR"}`)
	stream := domain.AccountStream("b")
	acc, _ := s.accounts.c.Peek(stream)
	unlock, err := s.locks.lock(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	s.accounts.c.Remove(stream)
	unlock()
	if s.residents.has(stream) {
		t.Fatal("made resident while its lock was held")
	}
	s.pipes.begin(stream, "k", acc, 0)
	s.toResident(stream, acc)
	if s.residents.has(stream) {
		t.Fatal("made resident with an append in flight")
	}
	s.pipes.end(stream, false)
	s.toResident(stream, acc)
	if s.residents.has(stream) {
		t.Fatal("made resident while stale")
	}
	s.pipes.resolve(stream, "k")
	s.pipes.takeStale(stream)
	s.toResident(stream, acc) // nothing was folded into it: the store's state
	if !s.residents.has(stream) {
		t.Fatal("a durable, free account not made resident")
	}
}

// refusingStore is the memory store failing every append while fail is set,
// before anything is written.
type refusingStore struct {
	*memory.Store
	fail atomic.Bool
}

func (r *refusingStore) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	if r.fail.Load() {
		return eventstore.AppendResult{}, errInjected
	}
	return r.Store.Append(ctx, stream, expected, events)
}

func (r *refusingStore) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	if r.fail.Load() {
		return nil, errInjected
	}
	return r.Store.AppendMulti(ctx, parts)
}

// TestResidentOnlyOfConfirmedState: an aggregate that held a decision whose
// append failed is never made resident, however late the cache's eviction
// callback hands it over (it runs after the cache's lock is released: once
// the stream is free and idle again, say): a resident is made only of an
// aggregate the store confirmed (domain.Account.Durable), whichever path
// folded the decision ahead of its append: a pipelined command, a transfer
// and a transaction (one write over two accounts, pipelined on one of them,
// appendSteps: the pipelined account folded ahead, the other only once
// written), an atomic batch. Each must reach the store and be failed by it
// (a reply of status error): a request refused before its write would pass
// on anything. Found by review: a late callback made the pending state of a
// failed append resident, and the store took the next decision on its
// phantom balance at the expected revision. Without the confirmation
// (Compact ignoring Durable) every case fails.
func TestResidentOnlyOfConfirmedState(t *testing.T) {
	cases := []struct {
		name string
		send func(s *Service) Reply
	}{
		{"pipelined deposit", func(s *Service) Reply {
			return post(t, s, "deposit", `{"idempotency_key":"x","account_id":"a","amount":50,"currency":"EUR"}`)
		}},
		{"transfer", func(s *Service) Reply {
			return post(t, s, "transfer", `{"idempotency_key":"x","transfer_id":"t","from":"a","to":"b","amount":30,"currency":"EUR"}`)
		}},
		{"post_transaction", func(s *Service) Reply {
			return post(t, s, "post_transaction", `{"idempotency_key":"x","transaction_id":"t","postings":[{"from":"a","to":"b","amount":30,"currency":"EUR"}]}`)
		}},
		{"atomic batch", func(s *Service) Reply {
			return s.HandleBatch(context.Background(), atomicBody("x", []batchCmd{
				{"deposit", map[string]any{"idempotency_key": "x1", "account_id": "a", "amount": 50, "currency": "EUR"}},
				{"withdraw", map[string]any{"idempotency_key": "x2", "account_id": "b", "amount": 5, "currency": "EUR"}},
			}), 0)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := &refusingStore{Store: memory.New()}
			s := New(st, Options{Clock: clock})
			defer s.Close()
			for _, id := range []string{"a", "b"} {
				mustApply(t, s, "open_account", fmt.Sprintf(`{"idempotency_key":"o%s","account_id":"%s","currency":"EUR"}`, id, id))
				mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%s","account_id":"%s","amount":100,"currency":"EUR"}`, id, id))
			}
			held := map[string]*domain.Account{}
			for _, id := range []string{"a", "b"} {
				held[id], _ = s.accounts.c.Peek(domain.AccountStream(id))
			}
			st.fail.Store(true)
			if r := c.send(s); r.Status != domain.StatusError {
				t.Fatalf("not the store's failure: %+v", r) // applied, or never written (invalid)
			}
			st.fail.Store(false)
			for id, acc := range held {
				stream := domain.AccountStream(id)
				s.pipes.takeStale(stream)   // free and idle again
				s.accounts.c.Remove(stream) // dropped now
				s.toResident(stream, acc)   // or handed over this late
				if s.residents.has(stream) && acc.Balance != 100 {
					t.Fatalf("%s made resident with a balance of %d the store never held", id, acc.Balance)
				}
			}
			// The store's state decides the next command.
			r := mustApply(t, s, "withdraw", `{"idempotency_key":"w","account_id":"a","amount":100,"currency":"EUR"}`)
			if r.Account.Balance != 0 {
				t.Fatalf("withdrawing the 100 the store holds leaves %d", r.Account.Balance)
			}
		})
	}
}

// TestLateEvictionKeepsTheNewerResident: an eviction callback that runs late
// (after the account was loaded again, took a deposit and was dropped again,
// its newer state made resident) does not replace the newer resident with its
// older aggregate. Found by review: the stale resident cost the next command a
// refused append and a reload. It fails when put replaces whatever is there.
func TestLateEvictionKeepsTheNewerResident(t *testing.T) {
	s := New(memory.New(), Options{Clock: clock})
	defer s.Close()
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"d1","account_id":"a","amount":100,"currency":"EUR"}`)
	stream := domain.AccountStream("a")
	older, _ := s.accounts.c.Peek(stream)
	s.accounts.c.Remove(stream)
	if !s.residents.take(stream).ok { // as if its callback had not run yet
		t.Fatal("a not made resident when dropped")
	}
	mustApply(t, s, "deposit", `{"idempotency_key":"d2","account_id":"a","amount":50,"currency":"EUR"}`)
	s.accounts.c.Remove(stream) // the newer state made resident
	s.toResident(stream, older) // the late callback
	res := s.residents.take(stream)
	if !res.ok || res.Revision() != 2 {
		t.Fatalf("resident %+v after the late callback, want the newer one at revision 2", res)
	}
	acc := s.newAccount("a")
	if err := res.Into(acc, res.tail); err != nil {
		t.Fatal(err)
	}
	if acc.Balance != 150 {
		t.Fatalf("resident balance %d, want 150", acc.Balance)
	}
}

// TestRefusedAppendsCounted: a command decided on an aggregate another
// instance wrote past is refused by the store's expected revision, counted
// (ledger_appends_refused_total, chaos scenario 1's evidence that appends
// failed in a live ledger), and decided again on the store's head. It fails
// when the refusal is not counted, or counted for an append the store took.
func TestRefusedAppendsCounted(t *testing.T) {
	st := memory.New()
	a, b := New(st, Options{Clock: clock}), New(st, Options{Clock: clock})
	defer a.Close()
	defer b.Close()
	mustApply(t, a, "open_account", `{"idempotency_key":"o","account_id":"x","currency":"EUR"}`)
	mustApply(t, a, "deposit", `{"idempotency_key":"d1","account_id":"x","amount":5,"currency":"EUR"}`)
	mustApply(t, b, "deposit", `{"idempotency_key":"d2","account_id":"x","amount":7,"currency":"EUR"}`)
	if got := counterValue(t, a.metrics.appendsRefused); got != 0 {
		t.Fatalf("%v appends refused before any was", got)
	}
	r := mustApply(t, a, "deposit", `{"idempotency_key":"d3","account_id":"x","amount":1,"currency":"EUR"}`)
	if got := counterValue(t, a.metrics.appendsRefused); got != 1 || r.Account.Balance != 13 {
		t.Fatalf("%v appends refused, balance %d; want 1 and 13", got, r.Account.Balance)
	}
}
