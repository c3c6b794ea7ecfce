package ledger

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
)

// TestPropertySagas interleaves seeded random transfers, holds (some expiring),
// refunds, closes and clock moves from several workers on two service instances
// over one store, resends earlier keys (the same request, or another one), and
// crashes the instances at random saga steps while a transfer process recovers
// concurrently. At the end, with the crashes off, one more recovery pass must
// leave every saga decided and the store must satisfy PROTOCOL.md §6 invariants
// 1, 2, 3 and 5; every resend must have answered the original outcome, and every
// key the original reply. LEDGER_PROPERTY_SEED replays another seed.
func TestPropertySagas(t *testing.T) {
	seed := int64(20261122)
	if v := os.Getenv("LEDGER_PROPERTY_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	sagaPathStores(t, func(t *testing.T, st ProcessStore) {
		ops := map[string]int{"TestPropertySagas/memory": 600, "TestPropertySagas/postgres": 400}[t.Name()]
		if ops == 0 || testing.Short() {
			ops = 200 // over gRPC (kurrentdb), or -short
		}
		t.Logf("seed %d, %d ops per worker", seed, ops)
		runSagaProperty(t, st, seed, 4, ops)
	})
}

type propHarness struct {
	t     *testing.T
	clk   *fakeClock
	svcs  []*Service
	clean *Service
	proc  *Process

	mu       sync.Mutex
	history  []propSent
	definite map[string]Reply // key -> first definite reply (applied, or a recorded rejection)
	errored  map[string]bool  // transfer keys that got an error reply
	holds    map[string][]string
	tids     []string
	crashes  int
}

type propSent struct {
	typ string
	kv  []any
}

func runSagaProperty(t *testing.T, st ProcessStore, seed int64, workers, ops int) {
	clk := newFakeClock()
	h := &propHarness{t: t, clk: clk, definite: map[string]Reply{}, errored: map[string]bool{}, holds: map[string][]string{}}
	crashRng := rand.New(rand.NewSource(seed ^ 0x5eed))
	var crashMu sync.Mutex
	crashing := true
	for i := 0; i < 2; i++ {
		s := newSagaService(st, clk)
		s.failpoint = func(step string) error {
			crashMu.Lock()
			defer crashMu.Unlock()
			if crashing && crashRng.Intn(12) == 0 {
				h.mu.Lock()
				h.crashes++
				h.mu.Unlock()
				return errCrash
			}
			return nil
		}
		h.svcs = append(h.svcs, s)
	}
	h.clean = newSagaService(st, clk)
	h.proc = NewProcess(newSagaService(st, clk), st, ProcessOptions{Grace: 5 * time.Minute})

	accounts := []string{"a0", "a1", "a2", "a3", "a4", "a5", "u0", "u1", "z"}
	for i, id := range accounts {
		cur := "EUR"
		if id[0] == 'u' {
			cur = "USD"
		}
		must(t, h.clean, "open_account", "idempotency_key", "open-"+id, "account_id", id, "currency", cur, "overdraft_limit", (i%3)*50)
		if id != "z" {
			must(t, h.clean, "deposit", "idempotency_key", "seed-"+id, "account_id", id, "amount", 1000, "currency", cur)
		}
	}
	must(t, h.clean, "close_account", "idempotency_key", "close-z", "account_id", "z") // transfers into it fail

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for i := 0; i < ops && !t.Failed(); i++ {
				h.step(rng, w, i, accounts)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Crashes off; far in the future, one more pass decides everything.
	crashMu.Lock()
	crashing = false
	crashMu.Unlock()
	clk.Advance(24 * time.Hour)
	for pass := 0; ; pass++ {
		st := recoverPass(t, h.proc)
		if st.Pending == 0 && st.Holds == 0 {
			break
		}
		if pass == 3 {
			t.Fatalf("still pending after %d passes: %+v", pass+1, st)
		}
	}
	a := audit(t, st, true)
	now := clk.Now()
	for id, acc := range a.accounts {
		for _, hd := range acc.Holds {
			if hd.Status == domain.HoldStatusActive && !hd.ExpiresAt.IsZero() && !now.Before(hd.ExpiresAt) {
				t.Fatalf("%s: hold %s active past its expiry", id, hd.ID)
			}
		}
	}
	// Every key answers its original reply; every crashed transfer was decided.
	ctx := context.Background()
	for key, want := range h.definite {
		got, found, err := h.clean.Lookup(ctx, key)
		if err != nil || !found || !sameReply(got, want) {
			t.Fatalf("lookup %q: %v %v\n got %+v\nwant %+v", key, found, err, got, want)
		}
	}
	for key := range h.errored {
		if _, ok := h.definite[key]; ok {
			continue
		}
		if r, found, err := h.clean.Lookup(ctx, key); err != nil || !found || r.Transfer == nil || r.Transfer.Status == "pending" {
			t.Fatalf("crashed transfer %q not decided: %v %v %+v", key, found, err, r)
		}
	}
	var completed, failed, rejected int
	for _, tr := range a.transfers {
		switch tr.Saga.Stage {
		case domain.SagaCompleted:
			completed++
		case domain.SagaFailed:
			failed++
		case domain.SagaRejected:
			rejected++
		}
	}
	t.Logf("%d transfers (%d completed, %d failed, %d rejected), %d keys decided, %d crashes",
		len(a.transfers), completed, failed, rejected, len(h.definite), h.crashes)
	if completed == 0 || failed == 0 || rejected == 0 || h.crashes == 0 {
		t.Fatal("the random run did not reach every path")
	}
}

// step sends one random command (or resend, or recovery pass, or clock move).
func (h *propHarness) step(rng *rand.Rand, w, i int, accounts []string) {
	t := h.t
	s := h.svcs[rng.Intn(len(h.svcs))]
	key := fmt.Sprintf("w%d-%d", w, i)
	acct := accounts[rng.Intn(len(accounts)-1)] // not z
	cur := "EUR"
	if acct[0] == 'u' {
		cur = "USD"
	}
	amount := int64(rng.Intn(300) + 1)
	var typ string
	var kv []any
	switch x := rng.Intn(100); {
	case x < 15: // resend: the same request under the same key
		h.mu.Lock()
		if len(h.history) == 0 {
			h.mu.Unlock()
			return
		}
		p := h.history[rng.Intn(len(h.history))]
		h.mu.Unlock()
		h.check(p.typ, p.kv, send(s, p.typ, p.kv...), true)
		return
	case x < 18: // the key of a decided command with another request
		h.mu.Lock()
		var p propSent
		for range 5 {
			if len(h.history) == 0 {
				break
			}
			c := h.history[rng.Intn(len(h.history))]
			if c.typ == "release_hold" || c.typ == "close_account" { // no amount to change
				continue
			}
			if _, ok := h.definite[c.kv[1].(string)]; ok {
				p = c
				break
			}
		}
		h.mu.Unlock()
		if p.typ == "" {
			return
		}
		other := append(append([]any{}, p.kv...), "amount", int64(1_000_000+rng.Intn(100)))
		if r := send(s, p.typ, other...); r.Code != domain.CodeIdempotencyKeyConflict {
			t.Errorf("%s %s reused with another amount: %+v", p.typ, body(other...), r)
		}
		return
	case x < 21:
		if _, err := h.proc.Recover(context.Background()); err != nil {
			t.Error(err)
		}
		return
	case x < 23:
		h.clk.Advance(time.Duration(rng.Intn(30)) * time.Minute)
		return
	case x < 50:
		to := accounts[rng.Intn(len(accounts))]
		switch rng.Intn(12) {
		case 0:
			to = acct // same account
		case 1:
			to = "z" // closed: fails after the debit
		}
		tid := "t" + key
		h.mu.Lock()
		if len(h.tids) > 0 && rng.Intn(20) == 0 {
			tid = h.tids[rng.Intn(len(h.tids))] // someone else's transfer id
		}
		h.tids = append(h.tids, tid)
		h.mu.Unlock()
		typ, kv = "transfer", []any{"idempotency_key", key, "transfer_id", tid, "from", acct, "to", to, "amount", amount, "currency", cur}
	case x < 62:
		typ, kv = "deposit", []any{"idempotency_key", key, "account_id", acct, "amount", amount, "currency", cur}
	case x < 70:
		typ, kv = "withdraw", []any{"idempotency_key", key, "account_id", acct, "amount", amount, "currency", cur}
	case x < 78:
		hold := "h" + key
		kv = []any{"idempotency_key", key, "account_id", acct, "hold_id", hold, "amount", amount, "currency", cur}
		if rng.Intn(2) == 0 {
			kv = append(kv, "expires_at", h.clk.Now().Add(time.Duration(rng.Intn(120)+1)*time.Minute).Format(time.RFC3339))
		}
		typ = "place_hold"
		h.mu.Lock()
		h.holds[acct] = append(h.holds[acct], hold)
		h.mu.Unlock()
	case x < 86:
		h.mu.Lock()
		hs := h.holds[acct]
		h.mu.Unlock()
		if len(hs) == 0 {
			return
		}
		hold := hs[rng.Intn(len(hs))]
		kv = []any{"idempotency_key", key, "account_id", acct, "hold_id", hold}
		typ = "release_hold"
		if rng.Intn(2) == 0 {
			typ = "capture_hold"
			if rng.Intn(2) == 0 {
				kv = append(kv, "amount", int64(rng.Intn(150)+1))
			}
		}
	case x < 98:
		h.mu.Lock()
		if len(h.history) == 0 {
			h.mu.Unlock()
			return
		}
		orig := h.history[rng.Intn(len(h.history))].kv[1].(string)
		h.mu.Unlock()
		typ, kv = "refund", []any{"idempotency_key", key, "original_key", orig}
		if rng.Intn(2) == 0 {
			kv = append(kv, "amount", int64(rng.Intn(200)+1))
		}
	default:
		typ, kv = "close_account", []any{"idempotency_key", key, "account_id", acct}
	}
	r := send(s, typ, kv...)
	h.mu.Lock()
	h.history = append(h.history, propSent{typ, kv})
	h.mu.Unlock()
	h.check(typ, kv, r, false)
}

// check compares a reply with what the key answered before.
func (h *propHarness) check(typ string, kv []any, r Reply, resend bool) {
	t := h.t
	key := kv[1].(string)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case r.Status == domain.StatusError:
		if r.Message == "" || (typ != "transfer" && typ != "refund") {
			t.Errorf("%s %s: unexpected error %+v", typ, body(kv...), r)
		}
		if typ == "transfer" {
			h.errored[key] = true
		}
		return
	case r.Status == domain.StatusInvalid && len(r.Fields) == 1 && r.Fields[0] == "expires_at":
		return // another worker moved the clock past it before it was handled
	case r.Status == domain.StatusInvalid:
		t.Errorf("%s %s: %+v", typ, body(kv...), r)
		return
	case r.Status == domain.StatusRejected && len(r.Events) == 0:
		return // not recorded: a retry decides again
	}
	if typ == "transfer" && (r.Transfer == nil || r.Transfer.Status == "pending") {
		t.Errorf("transfer replied undecided: %+v", r)
	}
	if first, ok := h.definite[key]; ok {
		// Two racing first sends may both have written (idempotently): the
		// duplicate flag may differ, nothing else.
		if !sameReply(first, r) {
			t.Errorf("%s %s answered differently:\n got %+v %+v\nwant %+v %+v", typ, body(kv...), r, r.Account, first, first.Account)
		}
		return
	}
	h.definite[key] = r
}
