package ledger

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestPropertySagas interleaves seeded random transfers, holds (some expiring),
// post_transaction of 1-3 postings (some refused: a later posting overdrawing,
// the closed account, another currency, another transaction's id), refunds
// (mostly of transactions: reservation sagas of their own), closes and clock
// moves from several workers on two service instances over one store, resends
// earlier keys (the same request, or another one), captures holds into
// accounts (capture sagas on these stores; some into the closed account or
// across currencies), and crashes the instances at random saga steps (a
// transfer's, a transaction's or a capture's) while a transfer process
// recovers concurrently. At the end, with the crashes off, one more recovery
// pass must leave every saga decided and the store must satisfy PROTOCOL.md §6
// invariants 1, 2, 3 and 5; every transaction posted all of its postings once
// or none, every capture into an account credited what it captured, no
// reservation (hold "txn~<id>") or capture guard ("capture~<key>") is left
// held; every resend must have answered the original outcome, every key the
// original reply, and the retry of every crashed transaction, refund or
// capture what its key answers.
// LEDGER_PROPERTY_SEED replays another seed.
func TestPropertySagas(t *testing.T) {
	seed := propertySeed(t, 20261122)
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		ops := map[string]int{"TestPropertySagas/memory-saga": 600, "TestPropertySagas/postgres-saga": 300}[t.Name()]
		if ops == 0 || testing.Short() {
			ops = 200 // over gRPC (kurrentdb), or -short
		}
		t.Logf("seed %d, %d ops per worker", seed, ops)
		runSagaProperty(t, st, seed, 4, ops)
	})
}

type propHarness struct {
	t     *testing.T
	clk   *devtest.Clock
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
	// txCrashes and captureCrashes count the crashes at a transaction saga's
	// and at a capture saga's steps; retried the post_transaction, refund and
	// capture_hold (with `to`) keys that got an error reply (a crash).
	txCrashes      int
	captureCrashes int
	retried        map[string]propSent
}

type propSent struct {
	typ string
	kv  []any
}

func runSagaProperty(t *testing.T, st ProcessStore, seed int64, workers, ops int) {
	clk := devtest.NewClock()
	h := &propHarness{t: t, clk: clk, definite: map[string]Reply{}, errored: map[string]bool{}, holds: map[string][]string{}, retried: map[string]propSent{}}
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
				if strings.HasPrefix(step, "transaction/") {
					h.txCrashes++
				}
				if strings.HasPrefix(step, "capture/") {
					h.captureCrashes++
				}
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
		// Settled first, as recoverPass is: unsettled, a pass that stopped
		// at the gap-safe horizon found nothing pending and ended the loop
		// with a hold placed last still active (its next pass expires it).
		devtest.Settle(t, st)
		sw, err := h.proc.Recover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if sw.Pending == 0 && sw.Holds == 0 && sw.Errors == 0 {
			break
		}
		if pass == 3 {
			audit(t, st, true) // names a saga still running
			t.Fatalf("still pending after %d passes: %+v", pass+1, sw)
		}
	}
	// A transaction or refund that crashed was decided by the process (its key
	// answers its outcome) or is decided by its retry now (before the audit);
	// either way the retry answers what the key answers.
	for key, p := range h.retried {
		prev, err := h.clean.Lookup(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if prev != nil && p.typ == "post_transaction" && (prev.Transaction == nil || prev.Status == domain.StatusError) {
			t.Fatalf("crashed transaction %q not decided: %+v", key, prev)
		}
		r := send(h.clean, p.typ, p.kv...)
		if r.Status == domain.StatusError || r.Status == domain.StatusInvalid || (prev != nil && !sameReply(r, *prev)) {
			t.Fatalf("%s %s retried: %+v\nthe key answers %+v", p.typ, body(p.kv...), r, prev)
		}
		h.check(p.typ, p.kv, r, true) // its key answers it from now on (checked below)
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
		got, err := h.clean.Lookup(ctx, key)
		if err != nil || got == nil || !sameReply(*got, want) {
			t.Fatalf("lookup %q: %v\n got %+v\nwant %+v", key, err, got, want)
		}
	}
	for key := range h.errored {
		if _, ok := h.definite[key]; ok {
			continue
		}
		if r, err := h.clean.Lookup(ctx, key); err != nil || r == nil || r.Transfer == nil || r.Transfer.Status == "pending" {
			t.Fatalf("crashed transfer %q not decided: %v %+v", key, err, r)
		}
	}
	// Every transaction decided, all of its postings applied once or none
	// (audit), every reservation released; every capture into an account
	// credited what it captured, or refused (audit), its guard released.
	var posted, txRejected, refundsPosted int
	for id, ts := range a.txs {
		switch ts.Outcome.Type {
		case domain.EvTransactionPosted:
			posted++
			if strings.Contains(id, "~refund~") {
				refundsPosted++
			}
		case domain.EvTransactionRejected:
			txRejected++
		}
	}
	var capturedTo, captureRefused int
	captureTo := map[string]bool{}
	for _, p := range h.history {
		if p.typ == "capture_hold" && slices.Contains(p.kv, any("to")) {
			captureTo[p.kv[1].(string)] = true
		}
	}
	for id, acc := range a.accounts {
		for _, hd := range acc.Holds {
			_, guard := domain.CaptureGuardKey(hd.ID)
			if (guard || strings.HasPrefix(hd.ID, "txn~")) && hd.Status == domain.HoldStatusActive {
				t.Fatalf("%s: reservation or guard %s still held (%d)", id, hd.ID, hd.Amount)
			}
		}
		for key, rec := range acc.Keys {
			if rec.Command != domain.CmdCaptureHold || !captureTo[key] {
				continue
			}
			if rec.Status == domain.StatusApplied {
				capturedTo++
			} else {
				captureRefused++
			}
		}
	}
	t.Logf("%d transactions (%d posted, %d of them refunds; %d rejected), %d crashed transactions, refunds and captures retried, %d crashes at a transaction's steps; %d captures into an account (%d refused), %d crashes at their steps",
		len(a.txs), posted, refundsPosted, txRejected, len(h.retried), h.txCrashes, capturedTo, captureRefused, h.captureCrashes)
	if posted == 0 || refundsPosted == 0 || txRejected == 0 || h.txCrashes == 0 || capturedTo == 0 || captureRefused == 0 || h.captureCrashes == 0 {
		t.Fatal("the random run did not reach every transaction and capture path")
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
	case x < 13: // resend: the same request under the same key
		h.mu.Lock()
		if len(h.history) == 0 {
			h.mu.Unlock()
			return
		}
		p := h.history[rng.Intn(len(h.history))]
		h.mu.Unlock()
		h.check(p.typ, p.kv, send(s, p.typ, p.kv...), true)
		return
	case x < 16: // the key of a decided command with another request
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
		if p.typ == "post_transaction" { // no amount of its own: another first posting
			ps := append([]map[string]any{}, p.kv[5].([]map[string]any)...)
			first := map[string]any{}
			for k, v := range ps[0] {
				first[k] = v
			}
			first["amount"] = int64(1_000_000 + rng.Intn(100))
			ps[0] = first
			other = append(append([]any{}, p.kv[:5]...), ps)
		}
		if r := send(s, p.typ, other...); r.Code != domain.CodeIdempotencyKeyConflict {
			t.Errorf("%s %s reused with another amount: %+v", p.typ, body(other...), r)
		}
		return
	case x < 19:
		if _, err := h.proc.Recover(context.Background()); err != nil {
			t.Error(err)
		}
		return
	case x < 21:
		h.clk.Advance(time.Duration(rng.Intn(30)) * time.Minute)
		return
	case x < 42:
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
	case x < 51:
		typ, kv = "deposit", []any{"idempotency_key", key, "account_id", acct, "amount", amount, "currency", cur}
	case x < 56:
		typ, kv = "withdraw", []any{"idempotency_key", key, "account_id", acct, "amount", amount, "currency", cur}
	case x < 62:
		hold := "h" + key
		kv = []any{"idempotency_key", key, "account_id", acct, "hold_id", hold, "amount", amount, "currency", cur}
		if rng.Intn(2) == 0 {
			kv = append(kv, "expires_at", h.clk.Now().Add(time.Duration(rng.Intn(120)+1)*time.Minute).Format(time.RFC3339))
		}
		typ = "place_hold"
		h.mu.Lock()
		h.holds[acct] = append(h.holds[acct], hold)
		h.mu.Unlock()
	case x < 68:
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
	case x < 71:
		// capture_hold into an account: a capture saga (some into the closed
		// account, some across currencies, some of a hold never placed).
		h.mu.Lock()
		hs := h.holds[acct]
		h.mu.Unlock()
		hold := "h-none"
		if len(hs) > 0 && rng.Intn(10) > 0 {
			hold = hs[rng.Intn(len(hs))]
			if rng.Intn(2) == 0 {
				hold = hs[len(hs)-1] // the latest: more likely still active
			}
		}
		to := accounts[rng.Intn(len(accounts)-1)]
		for to == acct || (to[0] == 'u') != (acct[0] == 'u') && rng.Intn(8) > 0 {
			to = accounts[rng.Intn(len(accounts)-1)] // mostly in one currency
		}
		if rng.Intn(10) == 0 {
			to = "z" // closed: its guard is refused
		}
		typ, kv = "capture_hold", []any{"idempotency_key", key, "account_id", acct, "hold_id", hold, "to", to}
		if rng.Intn(2) == 0 {
			kv = append(kv, "amount", int64(rng.Intn(150)+1))
		}
	case x < 85:
		// post_transaction of 1-3 postings over the accounts the transfers,
		// holds and refunds touch: some refused (a later posting overdrawing,
		// into the closed account, across currencies), some under another
		// transaction's id.
		n := 1 + rng.Intn(3)
		ps := make([]map[string]any, 0, n)
		for j := range n {
			from := acct
			if j > 0 {
				from = accounts[rng.Intn(len(accounts)-1)]
			}
			to := accounts[rng.Intn(len(accounts)-1)]
			for to == from || (to[0] == 'u') != (from[0] == 'u') && rng.Intn(8) > 0 {
				to = accounts[rng.Intn(len(accounts)-1)] // mostly in one currency
			}
			a := int64(rng.Intn(200) + 1)
			if rng.Intn(4) == 0 {
				a = int64(rng.Intn(900) + 100) // near what an account has
			}
			if j > 0 && rng.Intn(3) == 0 {
				// Paid back: the payer's outflow peaks in the middle, at about
				// what it has (all of it is reserved, not only the net).
				prev := ps[j-1]
				from, to = prev["to"].(string), prev["from"].(string)
				a = int64(rng.Intn(1500) + 1)
				prev["amount"] = a
			}
			if rng.Intn(20) == 0 && from != "z" {
				to = "z" // closed: its reservation is refused
			}
			if j == n-1 && n > 1 && rng.Intn(4) == 0 {
				a = 1_000_000 // overdraws: the whole transaction is refused
			}
			c := "EUR"
			if from[0] == 'u' {
				c = "USD"
			}
			ps = append(ps, map[string]any{"from": from, "to": to, "amount": a, "currency": c})
		}
		tid := "x" + key
		h.mu.Lock()
		if len(h.tids) > 0 && rng.Intn(25) == 0 {
			tid = h.tids[rng.Intn(len(h.tids))] // another transaction's id, or a transfer's
		}
		h.tids = append(h.tids, tid)
		h.mu.Unlock()
		typ, kv = "post_transaction", []any{"idempotency_key", key, "transaction_id", tid, "postings", ps}
	case x < 98:
		h.mu.Lock()
		if len(h.history) == 0 {
			h.mu.Unlock()
			return
		}
		o := h.history[rng.Intn(len(h.history))]
		for range 10 { // mostly refunds of transactions
			if o.typ == "post_transaction" || rng.Intn(3) == 0 {
				break
			}
			o = h.history[rng.Intn(len(h.history))]
		}
		h.mu.Unlock()
		typ, kv = "refund", []any{"idempotency_key", key, "original_key", o.kv[1].(string)}
		single := o.typ != "post_transaction" || len(o.kv[5].([]map[string]any)) == 1
		if (single && rng.Intn(2) == 0) || rng.Intn(10) == 0 {
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
		captureTo := typ == "capture_hold" && slices.Contains(kv, any("to"))
		if r.Message == "" || (typ != "transfer" && typ != "refund" && typ != "post_transaction" && !captureTo) {
			t.Errorf("%s %s: unexpected error %+v", typ, body(kv...), r)
		}
		switch typ {
		case "transfer":
			h.errored[key] = true
		case "refund", "post_transaction", "capture_hold":
			h.retried[key] = propSent{typ, kv}
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
	if typ == "post_transaction" && (r.Transaction == nil || (r.Transaction.Status == "posted") != (r.Status == domain.StatusApplied)) {
		t.Errorf("post_transaction %s replied undecided: %+v", body(kv...), r)
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
