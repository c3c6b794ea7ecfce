package ledger

import (
	"fmt"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestConditionsUnderConcurrency: two instances on one store, many clients, one
// hot merchant account with an overdraft (PROTOCOL.md v1.2 §2.3). Payers
// deposit into it while sweepers move up to a sum out of it (transfers and
// withdrawals with up_to), each sweep sent to both instances at once, and
// conditional writers race on expected_revision. Nothing is swept twice or
// into the overdraft (the merchant's balance never goes below zero), the money
// that left is exactly the sum of the replies' "moved", exactly one write of
// each round of conditional writers applies, and every resend answers the
// first decision. On PostgreSQL (one append per transfer) and on KurrentDB's
// test server (transfers as sagas, the debit fixing the amount).
func TestConditionsUnderConcurrency(t *testing.T) {
	for name, open := range map[string]func(testing.TB) eventstore.Store{
		"postgres":  func(t testing.TB) eventstore.Store { return devtest.Postgres(t) },
		"kurrentdb": func(t testing.TB) eventstore.Store { return devtest.KurrentDB(t) },
	} {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			a, b := newService(st), newService(st)
			// the merchant has an overdraft, which no sweep may use
			for _, id := range []string{"m", "p", "c"} {
				mustApply(t, a, "open_account", fmt.Sprintf(`{"idempotency_key":"open-%s","account_id":%q,"currency":"EUR","overdraft_limit":%d}`, id, id, map[string]int{"m": 50}[id]))
			}
			deposited, first := sweepRace(t, a, b)
			conditionalRounds(t, st, a, b)
			// every resend, to either instance, answers the first decision
			for key, want := range first {
				for _, s := range []*Service{a, b} {
					if got := postUntilAnswered(t, s, want.typ, want.body); !sameDecision(got, want.r) {
						t.Fatalf("%s resent: %+v, first %+v", key, got, want.r)
					}
				}
			}
			var moved int64
			partial, refused := 0, 0
			for _, f := range first {
				switch {
				case f.r.Moved == nil:
					refused++
				case *f.r.Moved < 15:
					partial++
				}
				if f.r.Moved != nil {
					moved += *f.r.Moved
				}
			}
			t.Logf("%d sweeps: %d moved less than asked, %d found nothing available", len(first), partial, refused)
			m := devtest.Account(t, st, "m")
			if m.Balance != deposited-moved || m.Balance < 0 {
				t.Fatalf("merchant holds %d; %d deposited, %d moved by the sweeps' replies", m.Balance, deposited, moved)
			}
			if p := devtest.Account(t, st, "p"); p.Balance > moved {
				t.Fatalf("payout holds %d, more than the %d moved", p.Balance, moved)
			}
			audit(t, st, true)
		})
	}
}

// sent is a command as sent and its first reply.
type sent struct {
	typ, body string
	r         Reply
}

// sweepRace runs payers and sweepers on merchant m through instances a and b
// at once; it returns what was deposited and each sweep's first reply.
func sweepRace(t *testing.T, a, b *Service) (int64, map[string]sent) {
	const payers, deposits, sweepers, sweeps = 3, 8, 4, 5
	var (
		mu        sync.Mutex
		first     = map[string]sent{}
		deposited int64
		wg        sync.WaitGroup
	)
	for p := range payers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range deposits {
				r := postUntilAnswered(t, []*Service{a, b}[i%2], "deposit", fmt.Sprintf(`{"idempotency_key":"pay-%d-%d","account_id":"m","amount":%d,"currency":"EUR"}`, p, i, 10+p+i))
				if r.Status != domain.StatusApplied {
					t.Errorf("deposit: %+v", r)
				}
				mu.Lock()
				deposited += int64(10 + p + i)
				mu.Unlock()
			}
		}()
	}
	for w := range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range sweeps {
				key := fmt.Sprintf("sweep-%d-%d", w, i)
				typ, body := "withdraw", fmt.Sprintf(`{"idempotency_key":%q,"account_id":"m","amount":15,"currency":"EUR","up_to":true}`, key)
				if (w+i)%2 == 0 {
					typ, body = "transfer", fmt.Sprintf(`{"idempotency_key":%q,"transfer_id":"t-%s","from":"m","to":"p","amount":20,"currency":"EUR","up_to":true}`, key, key)
				}
				replies := make([]Reply, 2)
				var both sync.WaitGroup
				for j, s := range []*Service{a, b} {
					both.Add(1)
					go func() { defer both.Done(); replies[j] = postUntilAnswered(t, s, typ, body) }()
				}
				both.Wait()
				checkSweep(t, key, replies)
				mu.Lock()
				first[key] = sent{typ, body, replies[0]}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return deposited, first
}

// checkSweep checks the two replies of one sweep sent to both instances at once.
func checkSweep(t *testing.T, key string, replies []Reply) {
	r := replies[0]
	if !sameDecision(replies[1], r) {
		t.Errorf("%s answered twice differently: %+v / %+v", key, r, replies[1])
	}
	switch {
	case r.Status == domain.StatusApplied && (r.Moved == nil || *r.Moved <= 0):
		t.Errorf("%s applied without moving: %+v", key, r)
	case r.Status == domain.StatusRejected && (r.Code != domain.CodeInsufficientFunds || r.Moved != nil):
		t.Errorf("%s refused: %+v", key, r)
	case r.Status != domain.StatusApplied && r.Status != domain.StatusRejected:
		t.Errorf("%s: %+v", key, r)
	}
}

// conditionalRounds: in each round, six clients read account c's revision and
// deposit with it expected, through both instances at once: one applies, the
// rest are refused with revision_mismatch, recorded.
func conditionalRounds(t *testing.T, st eventstore.Store, a, b *Service) {
	const rounds, writers = 4, 6
	for round := range rounds {
		rev := devtest.Account(t, st, "c").Revision
		replies := make([]Reply, writers)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[w] = postUntilAnswered(t, []*Service{a, b}[w%2], "deposit", fmt.Sprintf(`{"idempotency_key":"cond-%d-%d","account_id":"c","amount":1,"currency":"EUR","expected_revision":%d}`, round, w, rev))
			}()
		}
		wg.Wait()
		applied := 0
		for w, r := range replies {
			switch {
			case r.Status == domain.StatusApplied:
				applied++
			case r.Code != domain.CodeRevisionMismatch || len(r.Events) != 1:
				t.Fatalf("round %d writer %d: %+v", round, w, r)
			}
			again := postUntilAnswered(t, []*Service{a, b}[(w+1)%2], "deposit", fmt.Sprintf(`{"idempotency_key":"cond-%d-%d","account_id":"c","amount":1,"currency":"EUR","expected_revision":%d}`, round, w, rev))
			// KurrentDB answers an append it deduplicated as a fresh one
			// (docs/design.md, "Known edges"): the flag only where the store tells
			if !sameDecision(again, r) || (devtest.ReportsIdempotent(st) && !again.Duplicate) {
				t.Fatalf("round %d writer %d resent: %+v, first %+v", round, w, again, r)
			}
		}
		if applied != 1 {
			t.Fatalf("round %d: %d conditional writes applied at revision %d, want 1", round, applied, rev)
		}
		if c := devtest.Account(t, st, "c"); c.Revision != rev+writers || c.Balance != int64(round+1) {
			t.Fatalf("round %d: account at revision %d balance %d", round, c.Revision, c.Balance)
		}
	}
}

// sameDecision reports whether two replies carry one decision: status, code,
// events and what moved (the duplicate flag aside).
func sameDecision(x, y Reply) bool {
	if x.Status != y.Status || x.Code != y.Code || len(x.Events) != len(y.Events) || (x.Moved == nil) != (y.Moved == nil) {
		return false
	}
	if x.Moved != nil && *x.Moved != *y.Moved {
		return false
	}
	for i := range x.Events {
		if x.Events[i] != y.Events[i] {
			return false
		}
	}
	return true
}

// TestUpToTransferCrashAtEveryStep: a transfer with up_to run as a saga,
// crashed at every step of the completed and the failed path and recovered by
// the transfer process or the client's retry: the debit fixes the amount once
// (30 of the 100 asked, all that was available), the credit or the
// compensation moves exactly that, and every later answer says the same.
func TestUpToTransferCrashAtEveryStep(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		setup := newSagaService(st, clk)
		openFunded(t, setup, "payee", "EUR", 0)
		openClosed(t, setup, "closed", "EUR")
		rig := &crashRig{t: t, st: st, clk: clk, newService: newSagaService}
		type path struct {
			crashPath
			to, status string
			moved      bool
		}
		paths := []path{
			{crashPath{"completed", completedSteps}, "payee", domain.TransferStatusCompleted, true},
			{crashPath{"failed", failedSteps}, "closed", domain.TransferStatusFailed, false},
		}
		swept := int64(0)
		everyStep(rig, paths, byEither, func(p path, step, by, id string) {
			src := "src-" + id
			openFunded(t, setup, src, "EUR", 30)
			tb := append(transferBody("k-"+id, id, src, p.to, 100), "up_to", true)
			r := rig.crashThenRecover("transfer", tb, step, by, func() {
				audit(t, st, false) // half-way, the 30 are in flight, never more
			})
			if r.Transfer == nil || r.Transfer.Status != p.status || (r.Moved != nil) != p.moved || (p.moved && *r.Moved != 30) {
				t.Fatalf("%s crashed at %s, recovered by %s: %+v (moved %v)", id, step, by, r, r.Moved)
			}
			a := audit(t, st, true)
			if want := map[bool]int64{true: 0, false: 30}[p.moved]; a.balance(src) != want {
				t.Fatalf("%s: source holds %d, want %d", id, a.balance(src), want)
			}
			if p.moved {
				swept += 30
			}
		})
		if a := audit(t, st, true); a.balance("payee") != swept {
			t.Fatalf("payee holds %d, the sweeps moved %d", a.balance("payee"), swept)
		}
	})
}

// postUntilAnswered posts a command as a client must (PROTOCOL.md §5): a status "error"
// (here: concurrent writers on the hot account won MaxAttempts rounds) is
// not an answer, so the command is resent with its key until one comes, a
// bounded number of times.
func postUntilAnswered(t *testing.T, s *Service, typ, body string) Reply {
	t.Helper()
	const resends = 20
	var r Reply
	for range resends {
		if r = post(t, s, typ, body); r.Status != domain.StatusError {
			return r
		}
	}
	t.Errorf("%s %s: no answer after %d sends: %+v", typ, body, resends, r)
	return r
}
