package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// ---- harness shared by the saga, hold, refund and process tests ----

var quietLog = slog.New(slog.DiscardHandler)

func newSagaService(st Store, clk *devtest.Clock) *Service {
	return New(st, Options{Clock: clk.Now, Logger: quietLog})
}

// body builds a command body from name/value pairs.
func body(kv ...any) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func send(s *Service, typ string, kv ...any) Reply {
	return s.HandleRaw(context.Background(), typ, []byte(body(kv...)))
}

func must(t *testing.T, s *Service, typ string, kv ...any) Reply {
	t.Helper()
	r := send(s, typ, kv...)
	if r.Status != domain.StatusApplied {
		t.Fatalf("%s %s: %+v", typ, body(kv...), r)
	}
	return r
}

func openFunded(t *testing.T, s *Service, id, currency string, amount int64) {
	t.Helper()
	must(t, s, "open_account", "idempotency_key", "open-"+id, "account_id", id, "currency", currency)
	if amount > 0 {
		must(t, s, "deposit", "idempotency_key", "fund-"+id, "account_id", id, "amount", amount, "currency", currency)
	}
}

func transferBody(key, id, from, to string, amount int64) []any {
	return []any{"idempotency_key", key, "transfer_id", id, "from", from, "to", to, "amount", amount, "currency", "EUR"}
}

// sameReply compares two replies but for the duplicate flag.
func sameReply(a, b Reply) bool {
	a.Duplicate, b.Duplicate = false, false
	return reflect.DeepEqual(a, b)
}

func eventTypes(r Reply) []string {
	var out []string
	for _, e := range r.Events {
		out = append(out, strings.TrimPrefix(e.Stream, "account-")+":"+e.Type)
	}
	return out
}

// errCrash is what a failpoint returns to abort a handler between two steps.
var errCrash = errors.New("test: crash")

// crashAt makes s abort at the named step, every time it gets there.
func crashAt(s *Service, step string) {
	s.failpoint = func(got string) error {
		if got == step {
			return errCrash
		}
		return nil
	}
}

// ---- audit: the invariants of PROTOCOL.md §6 folded from the store ----

type sagaMoves struct {
	out, in, comp    int64
	outN, inN, compN int
}

type ledgerAudit struct {
	accounts  map[string]*domain.Account  // by account id
	transfers map[string]*domain.Transfer // by transfer id
	moves     map[string]*sagaMoves       // by saga key
	external  map[string]int64            // money in minus money out of the ledger, by currency
	inFlight  map[string]int64            // debited by undecided sagas and not yet credited, by currency
	// legs and posted are, by [key, currency], what the account events of a
	// transaction (or a capture into an account) moved and what its
	// TransactionPosted (or HoldCaptured) says it moved: [debits, credits].
	legs, posted map[[2]string]*[2]int64
	// txs are the transaction streams folded (a reservation saga, or one
	// append), by transaction id; keys every key an event was written under,
	// and every key such an event's origin names.
	txs  map[string]*domain.TransactionSaga
	keys map[string]bool
}

func (a *ledgerAudit) balance(id string) int64 { return a.accounts[id].Balance }

// audit reads the whole store and checks invariants 1, 2, 3 and 5, that every
// saga moved exactly its amount the way its decision says, and that every
// transaction (and capture into an account) moved exactly what it posted, or
// nothing. With decided set, every saga must have reached its decision.
func audit(t *testing.T, st eventstore.AllReader, decided bool) *ledgerAudit {
	t.Helper()
	a := &ledgerAudit{
		accounts: map[string]*domain.Account{}, transfers: map[string]*domain.Transfer{},
		moves: map[string]*sagaMoves{}, external: map[string]int64{}, inFlight: map[string]int64{},
		legs: map[[2]string]*[2]int64{}, posted: map[[2]string]*[2]int64{},
		txs: map[string]*domain.TransactionSaga{}, keys: map[string]bool{},
	}
	type keyWrite struct {
		stream string
		next   int
		count  int
	}
	keys := map[string]*keyWrite{}
	ids := map[string]bool{}
	next := map[string]uint64{}
	var last eventstore.Position
	after := eventstore.Start
	for {
		evs, err := st.ReadAll(context.Background(), after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			// Invariant 5: gapless revisions, unique IDs, increasing positions.
			if e.Position.Compare(last) <= 0 {
				t.Fatalf("position %s of %s@%d not after %s", e.Position, e.Stream, e.Revision, last)
			}
			last = e.Position
			if ids[e.ID.String()] {
				t.Fatalf("event ID %s twice", e.ID)
			}
			ids[e.ID.String()] = true
			if e.Revision != next[e.Stream] {
				t.Fatalf("%s: revision %d after %d events", e.Stream, e.Revision, next[e.Stream])
			}
			next[e.Stream]++
			ev, err := toStored(e)
			if err != nil {
				t.Fatal(err)
			}
			m := ev.Metadata
			a.keys[m.Key] = true
			if m.Origin != "" {
				a.keys[m.Origin] = true
			}
			// Invariant 1: each key wrote one set of events, once, to one stream
			// (besides the claim of a client key in its key stream).
			if !strings.HasPrefix(e.Stream, domain.KeyStreamPrefix) {
				kw := keys[m.Key]
				if kw == nil {
					kw = &keyWrite{stream: e.Stream, count: m.Count}
					keys[m.Key] = kw
				}
				if kw.stream != e.Stream || m.Index != kw.next || m.Index >= kw.count || m.Count != kw.count {
					t.Fatalf("key %q: event %d/%d in %s@%d after %d events in %s", m.Key, m.Index, m.Count, e.Stream, e.Revision, kw.next, kw.stream)
				}
				kw.next++
			} else if e.Revision != 0 {
				t.Fatalf("%s claimed twice", e.Stream)
			}
			switch {
			case strings.HasPrefix(e.Stream, domain.AccountStreamPrefix):
				a.foldAccount(t, ev)
			case strings.HasPrefix(e.Stream, domain.TransferStreamPrefix):
				id := strings.TrimPrefix(e.Stream, domain.TransferStreamPrefix)
				tr := a.transfers[id]
				if tr == nil {
					tr = domain.NewTransfer(id)
					a.transfers[id] = tr
				}
				if err := domain.EvolveTransfer(tr, ev); err != nil {
					t.Fatal(err)
				}
			case domain.IsTransactionStream(e.Stream):
				id := strings.TrimPrefix(e.Stream, domain.TransactionStreamPrefix)
				ts := a.txs[id]
				if ts == nil {
					ts = domain.NewTransactionSaga(id)
					a.txs[id] = ts
				}
				if err := domain.EvolveTransactionSaga(ts, ev); err != nil { // nothing after the outcome
					t.Fatal(err)
				}
				payload, err := domain.DecodeEvent(ev.Type, ev.Data)
				if err != nil {
					t.Fatal(err)
				}
				if p, ok := payload.(*domain.TransactionPosted); ok {
					// A saga's outcome is written under a derived key, with the
					// client's (its legs' origin) as its origin.
					for _, ps := range p.Postings {
						a.book(a.posted, domain.ClientKey(m), ps.Currency, ps.Amount, ps.Amount)
					}
				}
			}
		}
		if len(evs) < 1000 {
			break
		}
		after = evs[len(evs)-1].Position
	}
	for k, kw := range keys {
		if kw.next != kw.count {
			t.Fatalf("key %q wrote %d of its %d events", k, kw.next, kw.count)
		}
	}
	// Every transaction, and every capture into an account, is all or nothing:
	// its legs moved exactly what it says it posted, and nothing moved for one
	// that was not posted. A reservation saga still running (only when decided
	// is not set) may have posted some of its legs: their net is in flight.
	running := map[string]bool{}
	for id, ts := range a.txs {
		if !ts.Decided() {
			if decided {
				t.Fatalf("transaction %s (key %q): saga still running", id, ts.Key)
			}
			running[ts.Key] = true
		}
	}
	for k, l := range a.legs {
		if a.posted[k] == nil {
			if running[k[0]] {
				a.inFlight[k[1]] += l[0] - l[1]
				continue
			}
			t.Fatalf("%s moved %v by legs of key %q, which posted nothing", k[1], *a.legs[k], k[0])
		}
	}
	for k, p := range a.posted {
		if l := a.legs[k]; l == nil || *l != *p {
			moved := [2]int64{}
			if l != nil {
				moved = *l
			}
			t.Fatalf("%s: key %q posted %v (debits, credits), its legs moved %v", k[1], k[0], *p, moved)
		}
	}
	// Every saga moved money as its decision says; steps without a saga are a bug.
	seen := map[string]bool{}
	for _, tr := range a.transfers {
		sagas := []*domain.Saga{}
		if tr.Saga != nil {
			sagas = append(sagas, tr.Saga)
		}
		for _, k := range tr.RefundOrder {
			sagas = append(sagas, tr.Refunds[k])
		}
		for _, sg := range sagas {
			seen[sg.Key] = true
			mv := a.moves[sg.Key]
			if mv == nil {
				mv = &sagaMoves{}
			}
			ok := true
			switch sg.Stage {
			case domain.SagaCompleted:
				ok = mv.outN == 1 && mv.inN == 1 && mv.compN == 0 && mv.out == sg.Amount && mv.in == sg.Amount
			case domain.SagaFailed:
				ok = mv.outN == 1 && mv.inN == 0 && mv.compN == 1 && mv.out == sg.Amount && mv.comp == sg.Amount
			case domain.SagaRejected:
				ok = mv.outN == 0 && mv.inN == 0 && mv.compN == 0
			default:
				if decided {
					t.Fatalf("transfer %s: saga %q still %s", tr.ID, sg.Key, sg.Stage)
				}
				ok = mv.outN <= 1 && mv.inN+mv.compN <= mv.outN && mv.inN*mv.compN == 0 && (mv.outN == 0 || mv.out == sg.Amount)
				a.inFlight[sg.Currency] += mv.out - mv.in - mv.comp
			}
			if !ok {
				t.Fatalf("transfer %s: saga %q %s moved %+v of %d", tr.ID, sg.Key, sg.Stage, *mv, sg.Amount)
			}
		}
	}
	for k := range a.moves {
		if !seen[k] {
			t.Fatalf("money moved by %q, which is no saga", k)
		}
	}
	// Invariant 2: per currency, the accounts plus the money in flight equal what
	// came in minus what went out.
	sums := map[string]int64{}
	for _, acc := range a.accounts {
		sums[acc.Currency] += acc.Balance
	}
	for cur := range mergeKeys(sums, a.external, a.inFlight) {
		if sums[cur]+a.inFlight[cur] != a.external[cur] {
			t.Fatalf("%s: accounts %d + in flight %d != deposits - withdrawals %d", cur, sums[cur], a.inFlight[cur], a.external[cur])
		}
	}
	return a
}

func mergeKeys(ms ...map[string]int64) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

// book adds debits and credits to m's [key, currency].
func (a *ledgerAudit) book(m map[[2]string]*[2]int64, key, currency string, debit, credit int64) {
	k := [2]string{key, currency}
	if m[k] == nil {
		m[k] = &[2]int64{}
	}
	m[k][0] += debit
	m[k][1] += credit
}

// foldAccount folds an account event (invariant 3) and books its money.
func (a *ledgerAudit) foldAccount(t *testing.T, ev domain.StoredEvent) {
	t.Helper()
	id := strings.TrimPrefix(ev.Stream, domain.AccountStreamPrefix)
	acc := a.accounts[id]
	if acc == nil {
		acc = domain.NewAccount(id)
		a.accounts[id] = acc
	}
	if err := domain.EvolveAccount(acc, ev); err != nil { // checks every balance_after
		t.Fatal(err)
	}
	if acc.Available() < -acc.OverdraftLimit || acc.Available() != acc.Balance-acc.Held {
		t.Fatalf("%s@%d: balance %d held %d below the overdraft limit %d", ev.Stream, ev.Revision, acc.Balance, acc.Held, acc.OverdraftLimit)
	}
	payload, err := domain.DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		t.Fatal(err)
	}
	var amount int64
	var reason string
	switch e := payload.(type) {
	case *domain.Credited:
		amount, reason = e.Amount, e.Reason
	case *domain.Debited:
		amount, reason = -e.Amount, e.Reason
	case *domain.HoldCaptured:
		if e.To != "" { // credited to e.To in the same write
			a.book(a.legs, ev.Metadata.Key, e.Currency, e.Amount, 0)
			a.book(a.posted, ev.Metadata.Key, e.Currency, e.Amount, e.Amount)
			return
		}
		a.external[acc.Currency] -= e.Amount
		return
	default:
		return
	}
	mv := a.moves[ev.Metadata.Origin]
	switch reason {
	case domain.ReasonDeposit, domain.ReasonWithdrawal, domain.ReasonRefund:
		a.external[acc.Currency] += amount
		return
	case domain.ReasonTransactionOut, domain.ReasonTransactionIn, domain.ReasonCaptureIn:
		if amount < 0 {
			a.book(a.legs, ev.Metadata.Origin, acc.Currency, -amount, 0)
		} else {
			a.book(a.legs, ev.Metadata.Origin, acc.Currency, 0, amount)
		}
		return
	}
	if mv == nil {
		mv = &sagaMoves{}
		a.moves[ev.Metadata.Origin] = mv
	}
	switch reason {
	case domain.ReasonTransferOut, domain.ReasonRefundOut:
		mv.out, mv.outN = mv.out-amount, mv.outN+1
	case domain.ReasonTransferIn, domain.ReasonRefundIn:
		mv.in, mv.inN = mv.in+amount, mv.inN+1
	case domain.ReasonTransferCompensate, domain.ReasonRefundCompensate:
		mv.comp, mv.compN = mv.comp+amount, mv.compN+1
	default:
		t.Fatalf("%s@%d: unknown reason %q", ev.Stream, ev.Revision, reason)
	}
}

// ---- transfers ----

func TestTransferCompletes(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		first := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...)
		if first.Status != domain.StatusApplied || first.Code != domain.CodeOK || first.Duplicate ||
			first.Transfer == nil || *first.Transfer != (reply.TransferView{TransferID: "t1", Status: "completed"}) {
			t.Fatalf("transfer: %+v", first)
		}
		want := []string{"transfer-t1:TransferRequested", "alice:Debited", "bob:Credited", "transfer-t1:TransferCompleted"}
		if got := eventTypes(first); !reflect.DeepEqual(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if first.Account == nil || first.Account.AccountID != "alice" || first.Account.Balance != 70 || first.Position == "" {
			t.Fatalf("account %+v position %q", first.Account, first.Position)
		}
		// Duplicates, warm and cold, and the lookup: the same reply.
		for i, svc := range []*Service{s, newSagaService(st, clk)} {
			dup := send(svc, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...)
			if !dup.Duplicate || !sameReply(dup, first) {
				t.Fatalf("duplicate %d:\n got %+v\nwant %+v", i, dup, first)
			}
			got, found, err := svc.Lookup(context.Background(), "t-1")
			if err != nil || !found || !reflect.DeepEqual(got, first) {
				t.Fatalf("lookup %d: %v %v %+v", i, found, err, got)
			}
		}
		a := audit(t, st, true)
		if a.balance("alice") != 70 || a.balance("bob") != 30 {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

func TestTransferRejections(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		openFunded(t, s, "usd", "USD", 100)

		// Refused by the source: recorded, the same forever.
		poor := transferBody("t-poor", "poor", "alice", "bob", 500)
		r := send(s, "transfer", poor...)
		if r.Status != domain.StatusRejected || r.Code != domain.CodeInsufficientFunds || r.Transfer.Status != "rejected" {
			t.Fatalf("insufficient: %+v", r)
		}
		if got := eventTypes(r); !reflect.DeepEqual(got, []string{"transfer-poor:TransferRequested", "alice:CommandRejected", "transfer-poor:TransferRejected"}) {
			t.Fatalf("events %v", got)
		}
		must(t, s, "deposit", "idempotency_key", "more", "account_id", "alice", "amount", 1000, "currency", "EUR")
		if again := send(newSagaService(st, clk), "transfer", poor...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("retry after the deposit: %+v", again)
		}

		// Other currency than the source's: rejected before money moved.
		r = send(s, "transfer", "idempotency_key", "t-cur", "transfer_id", "cur", "from", "usd", "to", "bob", "amount", 5, "currency", "EUR")
		if r.Code != domain.CodeCurrencyMismatch || r.Transfer.Status != "rejected" {
			t.Fatalf("currency: %+v", r)
		}
		// To itself: recorded with the request.
		r = send(s, "transfer", transferBody("t-self", "self", "alice", "alice", 5)...)
		if r.Code != domain.CodeSameAccount || r.Transfer.Status != "rejected" || r.Account != nil ||
			!reflect.DeepEqual(eventTypes(r), []string{"transfer-self:TransferRequested", "transfer-self:TransferRejected"}) {
			t.Fatalf("same account: %+v", r)
		}
		if again := send(s, "transfer", transferBody("t-self", "self", "alice", "alice", 5)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("same account again: %+v", again)
		}

		// A missing account: not recorded, so the retry after it exists goes through.
		r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 5)...)
		if r.Code != domain.CodeAccountNotFound || len(r.Events) != 0 || len(devtest.StreamEvents(t, st, "transfer-early")) != 0 {
			t.Fatalf("missing destination: %+v", r)
		}
		openFunded(t, s, "carol", "EUR", 0)
		if r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 5)...); r.Status != domain.StatusApplied || r.Duplicate {
			t.Fatalf("after open: %+v", r)
		}
		if r = send(s, "transfer", transferBody("t-nosrc", "nosrc", "dave", "carol", 5)...); r.Code != domain.CodeAccountNotFound {
			t.Fatalf("missing source: %+v", r)
		}

		// The id of someone else's transfer, and a key bound to another request.
		before := len(devtest.ReadAll(t, st))
		r = send(s, "transfer", transferBody("t-other", "early", "alice", "carol", 5)...)
		if r.Code != domain.CodeTransferExists || r.Status != domain.StatusRejected || len(r.Events) != 0 {
			t.Fatalf("used id: %+v", r)
		}
		r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"amount"}) {
			t.Fatalf("same key, other amount: %+v", r)
		}
		r = send(s, "transfer", transferBody("more", "fresh", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("deposit's key as a transfer: %+v", r)
		}
		r = send(s, "transfer", transferBody("more", "early", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("deposit's key on a used transfer id: %+v", r)
		}
		if after := len(devtest.ReadAll(t, st)); after != before {
			t.Fatalf("refusals wrote %d events", after-before)
		}
		audit(t, st, true)
	})
}

// The compensation path: the destination is closed, so the source is credited
// back and the transfer ends failed, the source whole.
func TestTransferIntoClosedAccountFails(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		openFunded(t, s, "usd", "USD", 0)
		must(t, s, "close_account", "idempotency_key", "close-bob", "account_id", "bob")
		r := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 40)...)
		status := "failed" // debited, refused by the destination, credited back
		want := []string{"transfer-t1:TransferRequested", "alice:Debited", "bob:CommandRejected", "transfer-t1:TransferCreditRefused", "alice:Credited", "transfer-t1:TransferFailed"}
		if devtest.MultiAppends(st) { // one decision over both accounts: nothing leaves the source
			status, want = "rejected", []string{"transfer-t1:TransferRequested", "alice:CommandRejected", "transfer-t1:TransferRejected"}
		}
		if r.Status != domain.StatusRejected || r.Code != domain.CodeAccountClosed || r.Transfer.Status != status {
			t.Fatalf("reply %+v", r)
		}
		if got := eventTypes(r); !reflect.DeepEqual(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if r.Account.AccountID != "alice" || r.Account.Balance != 100 {
			t.Fatalf("source not whole: %+v", r.Account)
		}
		if dup := send(newSagaService(st, clk), "transfer", transferBody("t-1", "t1", "alice", "bob", 40)...); !dup.Duplicate || !sameReply(dup, r) {
			t.Fatalf("duplicate %+v", dup)
		}
		// Another currency at the destination fails the same way.
		r = send(s, "transfer", transferBody("t-2", "t2", "alice", "usd", 40)...)
		if r.Code != domain.CodeCurrencyMismatch || r.Transfer.Status != status || r.Account.Balance != 100 {
			t.Fatalf("currency at destination: %+v", r)
		}
		a := audit(t, st, true)
		if a.balance("alice") != 100 || a.balance("bob") != 0 || a.balance("usd") != 0 {
			t.Fatalf("balances alice %d bob %d usd %d", a.balance("alice"), a.balance("bob"), a.balance("usd"))
		}
	})
}

// The same transfer sent 10 times at once to two instances over one store: one
// debit, one credit, and every reply the same.
func TestSameTransferTenTimesTwoInstances(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		svcs := []*Service{newSagaService(st, clk), newSagaService(st, clk)}
		openFunded(t, svcs[0], "alice", "EUR", 100)
		openFunded(t, svcs[1], "bob", "EUR", 0)
		openFunded(t, svcs[0], "carol", "EUR", 0)
		must(t, svcs[1], "close_account", "idempotency_key", "close-carol", "account_id", "carol")
		for _, c := range []struct {
			key, id, to, status string
		}{{"t-1", "t1", "bob", "completed"}, {"t-2", "t2", "carol", map[bool]string{true: "rejected", false: "failed"}[devtest.MultiAppends(st)]}} {
			replies := make([]Reply, 10)
			var wg sync.WaitGroup
			for i := range replies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					replies[i] = send(svcs[i%2], "transfer", transferBody(c.key, c.id, "alice", c.to, 30)...)
				}()
			}
			wg.Wait()
			for i, r := range replies {
				if r.Transfer == nil || r.Transfer.Status != c.status || !sameReply(r, replies[0]) {
					t.Fatalf("%s reply %d: %+v\nfirst %+v", c.key, i, r, replies[0])
				}
			}
			got, _, err := svcs[0].Lookup(context.Background(), c.key)
			if err != nil || !sameReply(got, replies[0]) {
				t.Fatalf("lookup %+v %v", got, err)
			}
		}
		alice := devtest.StreamEvents(t, st, "account-alice")
		debits := 2 // one per transfer (the second credited back)
		if devtest.MultiAppends(st) {
			debits = 1 // the refused one never debited
		}
		if n := countType(alice, domain.EvDebited); n != debits {
			t.Fatalf("%d debits of alice", n)
		}
		if n := countType(devtest.StreamEvents(t, st, "account-bob"), domain.EvCredited); n != 1 {
			t.Fatalf("%d credits of bob", n)
		}
		a := audit(t, st, true)
		if a.balance("alice") != 70 || a.balance("bob") != 30 {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

// crashThenRecover sends command typ (body: the key "k-<id>" among its
// fields) to a service that crashes at step, calls halfway, then recovers it
// by the transfer process of another instance (by "process", past the grace
// period) or by the client's retry (by "retry", a duplicate since the request
// was written before the crash), and returns the recovered reply.
func crashThenRecover(t *testing.T, st ProcessStore, clk *devtest.Clock, newSagaService func(Store, *devtest.Clock) *Service, typ string, body []any, step, by string, halfway func()) Reply {
	t.Helper()
	var key string
	for i := 0; i+1 < len(body); i += 2 {
		if body[i] == "idempotency_key" {
			key = body[i+1].(string)
		}
	}
	crashing := newSagaService(st, clk)
	crashAt(crashing, step)
	if r := send(crashing, typ, body...); r.Status != domain.StatusError {
		t.Fatalf("%s at %s: no crash: %+v", key, step, r)
	}
	halfway()
	if by == "process" {
		clk.Advance(time.Minute) // past the grace period
		p := NewProcess(newSagaService(st, clk), st, ProcessOptions{Grace: time.Second})
		if _, err := p.Recover(context.Background()); err != nil {
			t.Fatal(err)
		}
		r, found, err := crashing.Lookup(context.Background(), key)
		if err != nil || !found {
			t.Fatalf("%s: lookup after recovery: %v %v", key, found, err)
		}
		return r
	}
	crashing.failpoint = nil
	r := send(crashing, typ, body...)
	if !r.Duplicate {
		t.Fatalf("%s: retry not a duplicate: %+v", key, r)
	}
	return r
}

// sagaSteps are the failpoints of a transfer, by the path it takes.
var (
	completedSteps = []string{"transfer/requested", "transfer/debit", "transfer/credit", "transfer/complete"}
	failedSteps    = []string{"transfer/requested", "transfer/debit", "transfer/credit", "transfer/refuse", "transfer/compensate", "transfer/fail"}
	rejectedSteps  = []string{"transfer/requested", "transfer/debit", "transfer/reject"}
)

// A crash at every step of every path, then a recovery by the transfer process
// (another instance) or by the client's retry: every transfer ends decided, no
// money created or lost. Forgetful: the same where every aggregate keeps one
// key, so that the steps a recovery runs again were forgotten (found by their
// claims on the stores that locate no events, as KurrentDB).
func TestTransferCrashAtEveryStep(t *testing.T) {
	transferCrashAtEveryStep(t, func(st Store, clk *devtest.Clock) *Service { return newSagaService(st, clk) })
}

func TestTransferCrashAtEveryStepForgetful(t *testing.T) {
	transferCrashAtEveryStep(t, func(st Store, clk *devtest.Clock) *Service {
		return New(st, Options{Clock: clk.Now, Logger: quietLog, RecentKeys: 1})
	})
}

func transferCrashAtEveryStep(t *testing.T, newSagaService func(Store, *devtest.Clock) *Service) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		setup := newSagaService(st, clk)
		openFunded(t, setup, "alice", "EUR", 1000)
		openFunded(t, setup, "bob", "EUR", 0)
		openFunded(t, setup, "closed", "EUR", 0)
		must(t, setup, "close_account", "idempotency_key", "close", "account_id", "closed")
		n := 0
		for _, path := range []struct {
			name   string
			steps  []string
			to     string
			amount int64
			status string
		}{
			{"completed", completedSteps, "bob", 10, "completed"},
			{"failed", failedSteps, "closed", 10, "failed"},
			{"rejected", rejectedSteps, "bob", 1_000_000, "rejected"},
		} {
			for _, step := range path.steps {
				for _, by := range []string{"process", "retry"} {
					n++
					id := fmt.Sprintf("%s-%s-%d", path.name, by, n)
					tb := transferBody("k-"+id, id, "alice", path.to, path.amount)
					r := crashThenRecover(t, st, clk, newSagaService, "transfer", tb, step, by, func() {
						audit(t, st, false) // half-way, money is in flight, never lost
					})
					if r.Transfer == nil || r.Transfer.Status != path.status {
						t.Fatalf("%s crashed at %s, recovered by %s: %+v", id, step, by, r)
					}
					if dup := send(newSagaService(st, clk), "transfer", tb...); !sameReply(dup, r) {
						t.Fatalf("%s: later duplicate differs:\n%+v\n%+v", id, dup, r)
					}
					audit(t, st, true)
				}
			}
		}
		a := audit(t, st, true)
		completed := int64(2 * len(completedSteps) * 10)
		if a.balance("alice") != 1000-completed || a.balance("bob") != completed {
			t.Fatalf("balances alice %d bob %d", a.balance("alice"), a.balance("bob"))
		}
	})
}
