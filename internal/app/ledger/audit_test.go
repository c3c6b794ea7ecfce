package ledger

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// The invariants of PROTOCOL.md §6 folded from a store: the tests' one checker
// of the ledger's histories (internal/app/audit, the production audit, imports
// this package, so its in-package tests cannot use it).

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
func audit(t testing.TB, st eventstore.AllReader, decided bool) *ledgerAudit {
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
	for _, e := range devtest.SettledAll(t, st) {
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
	// A capture saga whose guard stands may have captured, not yet credited.
	for id, acc := range a.accounts {
		for hid, h := range acc.Holds {
			if key, ok := domain.CaptureGuardKey(hid); ok && h.Status == domain.HoldStatusActive {
				if decided {
					t.Fatalf("%s: the guard of capture %q still stands", id, key)
				}
				running[key] = true
			}
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
		if l := a.legs[k]; l != nil && running[k[0]] {
			a.inFlight[k[1]] += l[0] - l[1]
			continue
		}
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
				// a pending sweep (up_to) records what its debit moved only when decided
				debited := mv.out == sg.Amount || (sg.UpTo && mv.out > 0 && mv.out <= sg.Amount)
				ok = mv.outN <= 1 && mv.inN+mv.compN <= mv.outN && mv.inN*mv.compN == 0 && (mv.outN == 0 || debited) &&
					(mv.inN == 0 || mv.in == mv.out) && (mv.compN == 0 || mv.comp == mv.out)
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
func (a *ledgerAudit) foldAccount(t testing.TB, ev domain.StoredEvent) {
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

// history serves its events as "all": a store's history, broken on purpose.
type history []eventstore.RecordedEvent

func (h history) ReadAll(_ context.Context, after eventstore.Position, max int) ([]eventstore.RecordedEvent, error) {
	from := 0
	if after != eventstore.Start {
		from = slices.IndexFunc(h, func(e eventstore.RecordedEvent) bool { return e.Position == after }) + 1
	}
	to := len(h)
	if max > 0 && from+max < to {
		to = from + max
	}
	return h[from:to], nil
}

// TestAuditFailsOnBrokenHistories: the audit passes a ledger's history and
// fails it, naming what is wrong, with an event stored twice, a revision
// missing, two events in the wrong order, a key decided twice, a balance
// stated wrong, and the credit of a completed transfer saga missing.
func TestAuditFailsOnBrokenHistories(t *testing.T) {
	stores := map[bool]eventstore.Store{true: devtest.Memory(t), false: devtest.WithoutMultiAppend(devtest.Memory(t))}
	clean := map[bool]history{}
	for multi, st := range stores {
		s := newSagaService(st, devtest.NewClock())
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		must(t, s, "transfer", transferBody("t-1", "t-1", "alice", "bob", 30)...)
		must(t, s, "withdraw", "idempotency_key", "wd", "account_id", "alice", "amount", 20, "currency", "EUR")
		clean[multi] = devtest.ReadAll(t, st)
		audit(t, clean[multi], true)
	}
	// after is e moved to the end of "all", at its stream's next revision.
	after := func(h history, e eventstore.RecordedEvent) eventstore.RecordedEvent {
		e.Position = h[len(h)-1].Position
		e.Position.Commit++
		e.Position.Prepare++
		e.Revision = uint64(len(slices.DeleteFunc(slices.Clone(h), func(x eventstore.RecordedEvent) bool { return x.Stream != e.Stream })))
		return e
	}
	for _, c := range []struct {
		name   string
		multi  bool
		want   string // in the audit's failure
		damage func(h history) history
	}{
		{"an event stored twice", true, "twice", func(h history) history {
			return append(h, after(h, h[len(h)-1]))
		}},
		{"a revision missing", true, "revision", func(h history) history {
			i := slices.IndexFunc(h, func(e eventstore.RecordedEvent) bool { return e.Stream == "account-alice" && e.Revision == 1 })
			return slices.Delete(h, i, i+1)
		}},
		{"two events in the wrong order", true, "not after", func(h history) history {
			i := 0
			for h[i].Stream == h[i+1].Stream {
				i++
			}
			h[i], h[i+1] = h[i+1], h[i]
			return h
		}},
		{"a key decided twice", true, `key "fund-alice"`, func(h history) history {
			i := slices.IndexFunc(h, func(e eventstore.RecordedEvent) bool {
				return e.Stream == "account-alice" && strings.Contains(string(e.Metadata), `"fund-alice"`)
			})
			again := after(h, h[i])
			again.ID = uuid.New()
			return append(h, again)
		}},
		{"a balance stated wrong", true, "balance_after", func(h history) history {
			i := slices.IndexFunc(h, func(e eventstore.RecordedEvent) bool {
				return e.Stream == "account-alice" && e.Type == domain.EvCredited
			})
			h[i].Data = []byte(strings.Replace(string(h[i].Data), `"balance_after":100`, `"balance_after":101`, 1))
			return h
		}},
		{"the credit of a completed transfer saga missing", false, `saga "t-1"`, func(h history) history {
			i := len(h) - 1
			for h[i].Stream != "account-bob" {
				i--
			}
			if h[i].Type != domain.EvCredited {
				t.Fatalf("bob's last event: %s", h[i].Type)
			}
			return slices.Delete(h, i, i+1)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			broken := c.damage(slices.Clone(clean[c.multi]))
			got := devtest.Failure(t, func(tb testing.TB) { audit(tb, broken, true) })
			if !strings.Contains(got, c.want) {
				t.Fatalf("the audit failed with %q, want it to name %q", got, c.want)
			}
			t.Log(got)
		})
	}
}
