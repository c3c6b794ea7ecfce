package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// TestFoldAccountStateBounded folds a long history over a few accounts (the
// benchmarks' mix: deposits, withdrawals, refusals, holds placed and
// released, as projtest.Synthetic writes it) and checks that what the fold
// keeps of each account stays bounded, whatever the account's history: no
// key record between commands and at most its active hold, its last closed
// one kept apart as its ID, status and digest (the per-account state the fold's peak grows with until each
// account holds it; docs/design.md, "What each tool keeps in memory").
func TestFoldAccountStateBounded(t *testing.T) {
	h := newBoundedHistory(20)
	f := NewFold()
	placed := 0
	for range 200 {
		for _, re := range h.next(len(h.accs) * 10) {
			f.Apply(re)
			if re.Type == domain.EvHoldPlaced {
				placed++
			}
		}
		if len(f.streams) != len(h.accs) {
			t.Fatalf("%d streams kept for %d accounts", len(f.streams), len(h.accs))
		}
		for id, a := range f.Accounts {
			if len(a.Keys) != 0 || len(a.Holds) > 1 {
				t.Fatalf("account %s at revision %d keeps %d key records and %d holds (at most 0 and 1)", id, a.Revision, len(a.Keys), len(a.Holds))
			}
			for _, hold := range a.Holds {
				if hold.Status != domain.HoldStatusActive {
					t.Fatalf("account %s at revision %d keeps its closed hold %s (only its ID, in its stream's state)", id, a.Revision, hold.ID)
				}
			}
		}
	}
	if f.ViolationCount() != 0 {
		t.Fatalf("%d violations in a valid history: %v", f.ViolationCount(), f.Violations[0])
	}
	if placed < 20*len(h.accs) {
		t.Fatalf("%d holds placed over %d accounts: too few to say the closed ones are forgotten", placed, len(h.accs))
	}
}

// BenchmarkFoldAccountHeap measures the live heap the fold keeps per account
// (its sets left out: they are PostgreSQL's in the audit and the rebuild's
// check) after 5, 15, 50 and 100 account events per account, the mix of
// projtest.Synthetic over LEDGER_BENCH_ACCOUNTS accounts (default 5,000). Half of
// BenchmarkReadTools' events are claims, so these are its 1,000,000,
// 3,000,000, 10,000,000 and 20,000,000 events over 100,000 accounts:
//
//	go test ./internal/app/audit -run '^$' -bench FoldAccountHeap -benchtime 1x
func BenchmarkFoldAccountHeap(b *testing.B) {
	accounts := 5000
	if n, err := strconv.Atoi(os.Getenv("LEDGER_BENCH_ACCOUNTS")); err == nil && n > 0 {
		accounts = n
	}
	for range b.N {
		h := newBoundedHistory(accounts)
		f := NewFold()
		f.sets = noSets{}
		folded := 0
		for _, per := range []int{5, 15, 50, 100} {
			for folded < per*accounts {
				for _, re := range h.next(accounts) {
					f.Apply(re)
					folded++
				}
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapAlloc)/float64(accounts), fmt.Sprintf("B/account@%d", per))
		}
		if f.ViolationCount() != 0 {
			b.Fatalf("%d violations in a valid history: %v", f.ViolationCount(), f.Violations[0])
		}
	}
}

// noSets keeps nothing of the history (BenchmarkFoldAccountHeap).
type noSets struct{}

func (noSets) eventID(*Fold, eventstore.RecordedEvent)              {}
func (noSets) group(*Fold, eventstore.RecordedEvent, string)        {}
func (noSets) home(*Fold, eventstore.RecordedEvent, string, string) {}
func (noSets) claim(*Fold, eventstore.RecordedEvent, string, claim) {}
func (noSets) row(*Fold, string, string, string, rowNote)           {}
func (noSets) flush(context.Context) error                          { return nil }
func (noSets) finish(context.Context, *Fold) error                  { return nil }
func (noSets) keys(context.Context) (int, error)                    { return 0, nil }
func (noSets) close()                                               {}

// boundedHistory writes account events as projtest.Synthetic does, without
// the key streams (the fold keeps nothing of a claim in memory).
type boundedHistory struct {
	rng  *rand.Rand
	accs []*boundedAccount
	out  []eventstore.RecordedEvent
	at   time.Time
	cmd  int
}

type boundedAccount struct {
	id            string
	rev           int64
	balance, held int64
	hold          string
}

func newBoundedHistory(accounts int) *boundedHistory {
	h := &boundedHistory{rng: rand.New(rand.NewPCG(23, 7)), at: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i := range accounts {
		a := &boundedAccount{id: fmt.Sprintf("b-%d", i), rev: -1}
		h.accs = append(h.accs, a)
		h.emit(a, domain.CmdOpenAccount, domain.EvAccountOpened, domain.AccountOpened{AccountID: a.id, Currency: "EUR"})
	}
	return h
}

// next returns the events of n more commands (and the openings not returned yet).
func (h *boundedHistory) next(n int) []eventstore.RecordedEvent {
	for range n {
		h.decide(h.accs[h.rng.IntN(len(h.accs))], int64(1+h.rng.IntN(1000)), h.rng.IntN(100))
	}
	out := h.out
	h.out = nil
	return out
}

func (h *boundedHistory) decide(a *boundedAccount, amount int64, k int) {
	switch {
	case k < 50:
		a.balance += amount
		h.emit(a, domain.CmdDeposit, domain.EvCredited, domain.Credited{Amount: amount, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: a.balance})
	case k < 80 && a.balance-a.held < amount:
		h.emit(a, domain.CmdWithdraw, domain.EvCommandRejected, domain.CommandRejected{Command: string(domain.CmdWithdraw), Code: domain.CodeInsufficientFunds, Message: "insufficient funds"})
	case k < 80:
		a.balance -= amount
		h.emit(a, domain.CmdWithdraw, domain.EvDebited, domain.Debited{Amount: amount, Currency: "EUR", Reason: domain.ReasonWithdrawal, BalanceAfter: a.balance})
	case k < 90 && a.hold == "" && a.balance-a.held >= amount:
		a.hold, a.held = fmt.Sprintf("h%d", h.cmd), a.held+amount
		h.emit(a, domain.CmdPlaceHold, domain.EvHoldPlaced, domain.HoldPlaced{HoldID: a.hold, Amount: amount, Currency: "EUR", HeldAfter: a.held})
	case k >= 90 && a.hold != "":
		h.emit(a, domain.CmdReleaseHold, domain.EvHoldReleased, domain.HoldReleased{HoldID: a.hold, Amount: a.held, Reason: domain.ReasonHoldReleased})
		a.hold, a.held = "", 0
	}
}

func (h *boundedHistory) emit(a *boundedAccount, command domain.CommandType, typ string, data any) {
	h.cmd++
	h.at = h.at.Add(time.Millisecond)
	a.rev++
	b, err := json.Marshal(data)
	if err != nil {
		panic(err)
	}
	m, err := json.Marshal(domain.Metadata{Key: fmt.Sprintf("b-%d", h.cmd), Command: string(command), RequestHash: "00", Count: 1, At: h.at, Schema: 1})
	if err != nil {
		panic(err)
	}
	pos := uint64(h.cmd)
	h.out = append(h.out, eventstore.RecordedEvent{ID: uuid.New(), Stream: domain.AccountStream(a.id), Revision: eventstore.Revision(a.rev),
		Position: eventstore.Position{Commit: pos, Prepare: pos}, Type: typ, Data: b, Metadata: m})
}
